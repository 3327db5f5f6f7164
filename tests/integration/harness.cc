#include "tests/integration/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace stash::testing {

std::string BinDir() {
  const char* dir = std::getenv("STASHD_BIN_DIR");
  if (dir == nullptr) {
    std::cerr << "STASHD_BIN_DIR is not set: run the tests through ctest" << std::endl;
    std::abort();
  }
  return dir;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/stashd-test.XXXXXX";
  const char* made = mkdtemp(tmpl);
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) StopWith(SIGKILL, std::chrono::seconds(5));
}

bool Process::Start(const std::vector<std::string>& argv, const std::string& log_prefix,
                    const std::vector<std::string>& env, uid_t as_uid) {
  out_path_ = log_prefix + ".out";
  err_path_ = log_prefix + ".err";
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are made (the parent has threads).
  std::vector<std::string> env_storage;
  for (const std::string& e : env) env_storage.push_back(e);  // first match wins in getenv
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  std::vector<std::string> arg_storage = argv;
  for (std::string& a : arg_storage) args.push_back(a.data());
  args.push_back(nullptr);
  const int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0 || err < 0) return false;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out, 1);
    dup2(err, 2);
    if (as_uid != static_cast<uid_t>(-1) &&
        (setgroups(0, nullptr) != 0 || setgid(as_uid) != 0 || setuid(as_uid) != 0)) {
      _exit(126);
    }
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out);
  close(err);
  return pid_ > 0;
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  const pid_t r = waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

int Process::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

int Process::StopWith(int sig, std::chrono::milliseconds timeout) {
  if (running()) kill(pid_, sig);
  const int code = Wait(timeout);
  if (code == -1 && running()) {
    kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(5));
  }
  return code;
}

namespace {
std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::string Process::Stdout() const { return Slurp(out_path_); }
std::string Process::Stderr() const { return Slurp(err_path_); }

UniqueFd ConnectUnix(const std::string& path, int type) {
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) fd.reset();
  return fd;
}

bool SocketAccepts(const std::string& path) { return ConnectUnix(path, SOCK_STREAM).valid(); }

DaemonProcess::DaemonProcess(std::vector<std::string> flags) {
  socket_ = dir_.path() + "/stashd.sock";
  // A build tree has it in daemon/; a bundle (scripts/bundle, the GPU check) in bin/, which
  // STASHD_BIN_DIR then names.
  std::string stashd = BinDir() + "/daemon/stashd";
  if (access(stashd.c_str(), X_OK) != 0) stashd = BinDir() + "/stashd";
  std::vector<std::string> argv = {stashd};
  bool has_socket = false;
  for (const std::string& f : flags) {
    if (f.rfind("--socket", 0) != 0) continue;
    has_socket = true;
    if (f.rfind("--socket=", 0) == 0) socket_ = f.substr(9);  // Ready() waits on that one
  }
  if (!has_socket) argv.push_back("--socket=" + socket_);
  argv.insert(argv.end(), flags.begin(), flags.end());
  process_.Start(argv, dir_.path() + "/stashd");
}

bool DaemonProcess::Ready() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10 * TimeScale());
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_.running()) return false;
    if (SocketAccepts(socket_)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool AllThreadsStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    DIR* dir = opendir(tasks.c_str());
    if (dir == nullptr) return false;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream stat(tasks + "/" + e->d_name + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos || paren + 2 >= line.size()) continue;  // gone
      if (line[paren + 2] != 'T' && line[paren + 2] != 't') all = false;
    }
    closedir(dir);
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

int TimeScale() {
  const char* s = std::getenv("STASH_TEST_TIME_SCALE");
  const int v = s != nullptr ? std::atoi(s) : 1;
  return v > 0 ? v : 1;
}

int RunCommand(const std::vector<std::string>& argv, std::string* out, std::string* err,
               const std::vector<std::string>& env, uid_t as_uid) {
  TempDir dir;
  Process p;
  if (!p.Start(argv, dir.path() + "/cmd", env, as_uid)) return -1;
  const int code = p.Wait(std::chrono::seconds(30 * TimeScale()));
  if (out != nullptr) *out = p.Stdout();
  if (err != nullptr) *err = p.Stderr();
  return code;
}

}  // namespace stash::testing

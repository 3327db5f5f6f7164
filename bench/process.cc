#include "bench/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/sys.h"

namespace stash::bench {
namespace {

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// waitpid with a deadline (polling: SIGCHLD handling would need process-wide state).
bool WaitPidFor(pid_t pid, int timeout_ms, int* status) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return true;  // not our child any more
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::vector<std::string>& argv,
                                              const std::string& stderr_path) {
  if (argv.empty()) return InvalidArgumentError("empty argv");
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return ErrnoStatus("pipe2");
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return ErrnoStatus("pipe2");
  }
  int err_fd = -1;
  if (!stderr_path.empty()) {
    err_fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (err_fd < 0) return ErrnoStatus("open(" + stderr_path + ")");
  }
  // Everything exec needs is prepared before fork: the child only calls async-signal-safe code.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return ErrnoStatus("fork");
  if (pid == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    execv(args[0], args.data());
    const char msg[] = "stash-bench: exec failed\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  if (err_fd >= 0) close(err_fd);
  std::string name = argv[0].substr(argv[0].rfind('/') + 1);
  for (const std::string& a : argv) {
    if (a.rfind("--role=", 0) == 0 || a.rfind("--task=", 0) == 0) name += " " + a.substr(2);
  }
  return std::unique_ptr<Child>(new Child(pid, to_child[1], from_child[0], std::move(name)));
}

Child::~Child() {
  if (in_fd_ >= 0) close(in_fd_);
  close(out_fd_);
  if (!reaped_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

Status Child::WriteLine(const std::string& line) {
  if (in_fd_ < 0) return FailedPreconditionError("stdin of " + name_ + " is closed");
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(in_fd_, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write to " + name_);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

StatusOr<std::string> Child::ReadLine(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    pollfd p{out_fd_, POLLIN, 0};
    const int left = MillisLeft(deadline);
    const int r = poll(&p, 1, left);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll on " + name_);
    }
    if (r == 0) {
      return DeadlineExceededError(name_ + " said nothing for " + std::to_string(timeout_ms) +
                                   " ms");
    }
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read from " + name_);
    }
    if (n == 0) return UnavailableError(name_ + " exited before answering");
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

void Child::CloseStdin() {
  if (in_fd_ >= 0) close(in_fd_);
  in_fd_ = -1;
}

int Child::Stop(int signal, int timeout_ms) {
  if (reaped_) return 0;
  kill(pid_, signal);
  return Wait(timeout_ms);
}

int Child::Wait(int timeout_ms) {
  if (reaped_) return 0;
  int status = 0;
  if (WaitPidFor(pid_, timeout_ms, &status)) {
    reaped_ = true;
    return status;
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  reaped_ = true;
  return -1;
}

std::map<std::string, std::string> ParseFields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

std::string SelfDir() {
  const std::string self = SelfPath();
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? "." : self.substr(0, slash);
}

bool WaitForPath(const std::string& path, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  struct stat st {};
  while (stat(path.c_str(), &st) != 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace stash::bench

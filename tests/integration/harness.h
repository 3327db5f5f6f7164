// Starts the real stashd binary on a socket in a fresh temp dir, for integration tests.
#ifndef STASH_TESTS_INTEGRATION_HARNESS_H_
#define STASH_TESTS_INTEGRATION_HARNESS_H_

#include <sys/socket.h>

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace stash::testing {

// The build directory (ctest sets STASHD_BIN_DIR); aborts the test binary when unset.
std::string BinDir();

// A fresh temp dir (mkdtemp under /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process started with fork+exec; stdout and stderr go to files in `dir`.
class Process {
 public:
  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // SIGKILLs and reaps a process still running

  // Starts `argv` with extra environment `env` ("NAME=value"), as Unix user and group `as_uid`
  // when it is not -1 (the test must run as root); false when fork/exec failed.
  bool Start(const std::vector<std::string>& argv, const std::string& log_prefix,
             const std::vector<std::string>& env = {}, uid_t as_uid = static_cast<uid_t>(-1));
  pid_t pid() const { return pid_; }
  bool running();
  // Sends `sig`; waits up to `timeout` for the exit; returns the exit code (128+signal when
  // killed by one) or -1 on timeout.
  int StopWith(int sig, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for the exit; exit code, 128+signal, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::string out_path_;
  std::string err_path_;
};

// A stashd on `<temp dir>/stashd.sock`, started with `flags` (plus --socket, unless given).
class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> flags = {});
  // Waits until the socket accepts connections (up to 10 s); false if the daemon died first.
  bool Ready();
  const std::string& socket() const { return socket_; }
  Process& process() { return process_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::string socket_;
  Process process_;
};

// A connection to the Unix socket at `path` (SOCK_SEQPACKET: the descriptor socket; SOCK_STREAM:
// the gRPC one); invalid when the connect fails.
UniqueFd ConnectUnix(const std::string& path, int type = SOCK_SEQPACKET);

// Whether a Unix socket at `path` accepts connections.
bool SocketAccepts(const std::string& path);

// Whether every thread of `pid` is stopped (state T in /proc/PID/task/*/stat), polled for up to
// 5 s: kill(SIGSTOP) returns before the threads stop, and one still running may serve a request.
bool AllThreadsStopped(pid_t pid);

// How much slower than a plain build this one runs (STASH_TEST_TIME_SCALE, default 1; the
// sanitizer presets set more): scales the few deadlines that are requirements, like "pages
// return within 1 s".
int TimeScale();

// Runs `argv` to completion (up to 30 s), as `as_uid` when it is not -1; returns the exit code
// (126 when it could not become that user) and fills stdout/stderr.
int RunCommand(const std::vector<std::string>& argv, std::string* out, std::string* err,
               const std::vector<std::string>& env = {}, uid_t as_uid = static_cast<uid_t>(-1));

}  // namespace stash::testing

#endif  // STASH_TESTS_INTEGRATION_HARNESS_H_

// Child processes for stash-bench: the daemon, the ping server and the client workers.
//
// stash-bench's orchestrating process never creates a gRPC channel, so it may fork; every child
// execs at once (a process holding gRPC threads must never be forked, only exec'd).
#ifndef STASH_BENCH_PROCESS_H_
#define STASH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stash/status.h"

namespace stash::bench {

// One exec'd child. Its stdin and stdout are pipes to this process (line-oriented); its stderr
// goes to `stderr_path` (appended) or is inherited when that is empty. Not thread-safe.
class Child {
 public:
  static StatusOr<std::unique_ptr<Child>> Spawn(const std::vector<std::string>& argv,
                                                const std::string& stderr_path);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Kills (SIGKILL) and reaps the child if it still runs.
  ~Child();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Writes one line ('\n' appended) to the child's stdin.
  Status WriteLine(const std::string& line);
  // Reads the next line of the child's stdout (without '\n'). DEADLINE_EXCEEDED after
  // `timeout_ms`; UNAVAILABLE when the child closed stdout (exited).
  StatusOr<std::string> ReadLine(int timeout_ms);
  // Closes the child's stdin (workers take EOF as "stop").
  void CloseStdin();
  // Sends `signal` and waits up to `timeout_ms` for the exit, then SIGKILLs. Returns the wait
  // status as waitpid gives it (or -1 when it had to be killed).
  int Stop(int signal, int timeout_ms);
  // Waits up to `timeout_ms` for the child to exit on its own; SIGKILLs it after that.
  int Wait(int timeout_ms);

 private:
  Child(pid_t pid, int in_fd, int out_fd, std::string name)
      : pid_(pid), in_fd_(in_fd), out_fd_(out_fd), name_(std::move(name)) {}

  pid_t pid_;
  int in_fd_;   // the child's stdin; -1 once closed
  int out_fd_;  // the child's stdout
  std::string name_;
  std::string buffered_;  // read but not yet returned
  bool reaped_ = false;
};

// Parses "key=value key=value ..." (values without spaces) into a map.
std::map<std::string, std::string> ParseFields(const std::string& line);

// The directory of the running executable (from /proc/self/exe).
std::string SelfDir();
std::string SelfPath();

// Waits until `path` exists, up to `timeout_ms`. Returns whether it appeared.
bool WaitForPath(const std::string& path, int timeout_ms);

}  // namespace stash::bench

#endif  // STASH_BENCH_PROCESS_H_

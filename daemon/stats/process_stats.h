// The daemon process's own resource use, as Prometheus's process_* series report it: resident
// and virtual memory, open file descriptors and their limit, CPU time and start time. Read from
// /proc/self on every call (a scrape), nothing cached.
#ifndef STASH_DAEMON_PROCESS_STATS_H_
#define STASH_DAEMON_PROCESS_STATS_H_

#include <cstdint>
#include <string_view>

#include "stash/status.h"

namespace stash::daemon {

struct ProcessStats {
  uint64_t resident_bytes = 0;  // RSS: pages resident now times the page size
  uint64_t virtual_bytes = 0;   // size of the address space
  uint64_t open_fds = 0;        // entries of /proc/self/fd
  uint64_t max_fds = 0;         // RLIMIT_NOFILE's soft limit
  double cpu_seconds = 0;       // user plus system time since start
  double start_time_s = 0;      // start, in seconds since the Unix epoch
};

// This process's numbers. An error names the /proc file that could not be read or parsed.
StatusOr<ProcessStats> ReadProcessStats();

// Parses the fields ReadProcessStats needs from the text of /proc/<pid>/stat. `ticks_per_s`:
// sysconf(_SC_CLK_TCK); `page_bytes`: the page size; `boot_time_s`: /proc/stat's btime.
// INVALID_ARGUMENT for text that is not a stat line. Exposed for tests.
StatusOr<ProcessStats> ParseProcStat(std::string_view stat, double ticks_per_s, uint64_t page_bytes,
                                     double boot_time_s);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_PROCESS_STATS_H_

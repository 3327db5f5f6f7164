#include "daemon/stats/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/macros.h"

namespace stash::daemon {
namespace {

StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return UnavailableError(std::string("cannot read ") + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool ToU64(const std::string& token, uint64_t* out) {
  if (token.empty()) return false;
  char* end = nullptr;
  *out = std::strtoull(token.c_str(), &end, 10);
  return end != nullptr && *end == '\0';
}

}  // namespace

StatusOr<ProcessStats> ParseProcStat(std::string_view stat, double ticks_per_s, uint64_t page_bytes,
                                     double boot_time_s) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields start
  // after the last ')'. proc(5) numbers them from 1; field 3 (state) is tokens[0] here.
  const size_t paren = stat.rfind(')');
  if (paren == std::string_view::npos) {
    return InvalidArgumentError("not a /proc/<pid>/stat line: no ')' after the command name");
  }
  std::istringstream rest{std::string(stat.substr(paren + 1))};
  std::vector<std::string> tokens;
  for (std::string token; rest >> token;) tokens.push_back(token);
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kStart = 22 - 3, kVsize = 23 - 3,
                   kRss = 24 - 3;
  if (tokens.size() <= kRss) {
    return InvalidArgumentError("not a /proc/<pid>/stat line: " + std::to_string(tokens.size()) +
                                " fields after the command name, want at least 22");
  }
  uint64_t utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
  if (!ToU64(tokens[kUtime], &utime) || !ToU64(tokens[kStime], &stime) ||
      !ToU64(tokens[kStart], &start) || !ToU64(tokens[kVsize], &vsize) ||
      !ToU64(tokens[kRss], &rss)) {
    return InvalidArgumentError("not a /proc/<pid>/stat line: a numeric field is not a number");
  }
  ProcessStats out;
  out.cpu_seconds = static_cast<double>(utime + stime) / ticks_per_s;
  out.start_time_s = boot_time_s + static_cast<double>(start) / ticks_per_s;
  out.virtual_bytes = vsize;
  out.resident_bytes = rss * page_bytes;
  return out;
}

StatusOr<ProcessStats> ReadProcessStats() {
  STASH_ASSIGN_OR_RETURN(const std::string stat, ReadFile("/proc/self/stat"));
  STASH_ASSIGN_OR_RETURN(const std::string system, ReadFile("/proc/stat"));
  double boot_time_s = 0;
  std::istringstream lines(system);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("btime ", 0) == 0) boot_time_s = std::strtod(line.c_str() + 6, nullptr);
  }
  if (boot_time_s <= 0) return UnavailableError("no btime line in /proc/stat");
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  StatusOr<ProcessStats> parsed =
      ParseProcStat(stat, ticks > 0 ? static_cast<double>(ticks) : 100.0,
                    page > 0 ? static_cast<uint64_t>(page) : 4096, boot_time_s);
  if (!parsed.ok()) return InvalidArgumentError("/proc/self/stat: " + parsed.status().message());
  ProcessStats out = *parsed;
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    uint64_t entries = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++entries;
    }
    closedir(dir);
    out.open_fds = entries > 0 ? entries - 1 : 0;  // less the one opendir holds
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) out.max_fds = limit.rlim_cur;
  return out;
}

}  // namespace stash::daemon

#include "bench/report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace stash::bench {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Ratio(double r) { return Fixed(r, 2) + "x"; }

Verdict AtLeast(double v, double bound) { return v >= bound ? Verdict::kMet : Verdict::kMissed; }
Verdict AtMost(double v, double bound) { return v <= bound ? Verdict::kMet : Verdict::kMissed; }

std::string MarkdownTable(const std::vector<Row>& rows) {
  const std::vector<std::string> head = {"#",     "figure", "value", "baseline (same run)",
                                         "ratio", "target", "met"};
  std::vector<std::vector<std::string>> cells;
  for (const Row& r : rows) {
    const char* met = r.verdict == Verdict::kMet      ? "yes"
                      : r.verdict == Verdict::kMissed ? "**no**"
                                                      : "";
    cells.push_back({r.section, r.figure, r.value, r.baseline, r.ratio, r.target, met});
  }
  std::vector<size_t> width(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    width[c] = head[c].size();
    for (const auto& row : cells) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& row) {
    out << '|';
    for (size_t c = 0; c < row.size(); ++c) {
      out << ' ' << row[c] << std::string(width[c] - row[c].size(), ' ') << " |";
    }
    out << '\n';
  };
  line(head);
  out << '|';
  for (size_t c = 0; c < head.size(); ++c) out << std::string(width[c] + 2, '-') << '|';
  out << '\n';
  for (const auto& row : cells) line(row);
  return out.str();
}

std::string MachineSummary() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string l; std::getline(cpuinfo, l);) {
    if (l.rfind("model name", 0) == 0) {
      model = l.substr(l.find(':') + 2);
      break;
    }
  }
  double mem_gib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string l; std::getline(meminfo, l);) {
    if (l.rfind("MemTotal:", 0) == 0) {
      mem_gib = std::stod(l.substr(9)) / (1024.0 * 1024.0);
      break;
    }
  }
  utsname u{};
  uname(&u);
  std::ostringstream out;
  out << model << ", " << sysconf(_SC_NPROCESSORS_ONLN) << " cores, " << Fixed(mem_gib, 1)
      << " GiB RAM, " << u.sysname << ' ' << u.release;
  return out.str();
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

}  // namespace stash::bench

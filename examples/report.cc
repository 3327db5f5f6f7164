#include "examples/report.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace stash::demo {

void ReportWriter::Write(std::string_view kind, const std::vector<std::string>& fields) {
  std::string line(kind);
  for (const std::string& field : fields) {
    line += '\t';
    for (char c : field) line += (c == '\t' || c == '\n' || c == '\r') ? ' ' : c;
  }
  line += '\n';
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the launcher is gone: nobody is left to tell
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::vector<std::string> EncodeTotals(const RankTotals& t) {
  const uint64_t values[] = {t.device, t.host,       t.overflow,    t.spills,  t.overflows,
                             t.bytes,  t.kept_bytes, t.worst_bytes, t.dropped, t.assignments};
  std::vector<std::string> out;
  for (uint64_t v : values) out.push_back(std::to_string(v));
  return out;
}

std::optional<RankTotals> DecodeTotals(const std::vector<std::string>& fields) {
  RankTotals t;
  uint64_t* targets[] = {&t.device, &t.host,       &t.overflow,    &t.spills,  &t.overflows,
                         &t.bytes,  &t.kept_bytes, &t.worst_bytes, &t.dropped, &t.assignments};
  constexpr size_t kCount = sizeof(targets) / sizeof(targets[0]);
  if (fields.size() != kCount) return std::nullopt;
  for (size_t i = 0; i < kCount; ++i) {
    char* end = nullptr;
    errno = 0;
    *targets[i] = std::strtoull(fields[i].c_str(), &end, 10);
    if (fields[i].empty() || *end != '\0' || errno != 0) return std::nullopt;
  }
  return t;
}

std::vector<std::string> SplitFields(std::string_view line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.emplace_back(line.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) return out;
    start = tab + 1;
  }
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof(buf), "%llu %s", static_cast<unsigned long long>(v), kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  }
  return buf;
}

}  // namespace stash::demo

// stash-bench's one table: each figure, its baseline (measured in the same run), the ratio and
// the target.
#ifndef STASH_BENCH_REPORT_H_
#define STASH_BENCH_REPORT_H_

#include <string>
#include <vector>

namespace stash::bench {

enum class Verdict { kNoTarget, kMet, kMissed };

struct Row {
  std::string section;   // "1", "2", ... (the numbering)
  std::string figure;    // what was measured
  std::string value;     // formatted, with its unit
  std::string baseline;  // formatted, with what it is; empty = none
  std::string ratio;     // "0.84x"; empty = none
  std::string target;    // "ratio >= 0.80x"; empty = none
  Verdict verdict = Verdict::kNoTarget;
};

// "12.3" with `digits` decimals.
std::string Fixed(double v, int digits);
// "0.84x".
std::string Ratio(double r);
// The verdict of value `v` against a lower bound (at_least) or upper bound.
Verdict AtLeast(double v, double bound);
Verdict AtMost(double v, double bound);

// A GitHub-flavoured Markdown table of `rows`.
std::string MarkdownTable(const std::vector<Row>& rows);

// "AMD EPYC, 2 cores, 23.4 GiB RAM, Linux 6.1.0-..." from /proc and uname.
std::string MachineSummary();

// The 1-minute load average (/proc/loadavg); -1 when unreadable.
double LoadAverage();

}  // namespace stash::bench

#endif  // STASH_BENCH_REPORT_H_

// What a rank process tells the launcher: one tab-separated line per message over a pipe, so
// the launcher can print every rank's lines in (step, rank) order and one summary.
#ifndef STASH_EXAMPLES_REPORT_H_
#define STASH_EXAMPLES_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stash::demo {

// Line kinds. Text fields never hold tabs or newlines (the writer replaces them).
//   open    socket page_bytes pool_pages host_tier_pages   the session is up
//   step    step text                                      one step's report line
//   error   text                                           the rank stopped on this error
//   parity  text                                           bits differ: rank, step, layer, element
//   totals  RankTotals fields                              the rank's whole run
//   hold    (none)                                         holding the last step's stashes
inline constexpr std::string_view kOpenLine = "open";
inline constexpr std::string_view kStepLine = "step";
inline constexpr std::string_view kErrorLine = "error";
inline constexpr std::string_view kParityLine = "parity";
inline constexpr std::string_view kTotalsLine = "totals";
inline constexpr std::string_view kHoldLine = "hold";

// A rank's run, summed over its steps.
struct RankTotals {
  uint64_t device = 0, host = 0, overflow = 0;  // stashes per tier, from the completions
  uint64_t spills = 0, overflows = 0;           // the daemon's session counters at the end
  uint64_t bytes = 0;        // payload the daemon held at each step's peak, summed over steps
  uint64_t kept_bytes = 0;   // activation bytes kept in the rank after an overflow, summed
  uint64_t worst_bytes = 0;  // layers * max_tokens * row_bytes, summed over steps
  uint64_t dropped = 0, assignments = 0;  // routed (token, expert) pairs dropped / made
};

// Writes report lines to a file descriptor it does not own (write() per line, EINTR retried).
class ReportWriter {
 public:
  explicit ReportWriter(int fd) : fd_(fd) {}
  void Write(std::string_view kind, const std::vector<std::string>& fields);

 private:
  int fd_;
};

std::vector<std::string> EncodeTotals(const RankTotals& totals);
std::optional<RankTotals> DecodeTotals(const std::vector<std::string>& fields);

// Splits one line (without its newline) at tabs.
std::vector<std::string> SplitFields(std::string_view line);

// "512 B", "4 KiB", "1.50 MiB", "2.25 GiB": whole numbers without decimals.
std::string FormatBytes(uint64_t bytes);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_REPORT_H_

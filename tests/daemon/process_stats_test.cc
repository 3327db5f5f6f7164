#include "daemon/stats/process_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <string>

namespace stash::daemon {
namespace {

// A /proc/<pid>/stat line whose command name holds a space and a ')', as comm may.
constexpr const char* kStat =
    "4242 (stash d) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 50 0 0 20 0 9 0 12345 "
    "1073741824 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0";

TEST(ProcessStats, ParsesTheFieldsAfterTheLastParenthesis) {
  const StatusOr<ProcessStats> s = ParseProcStat(kStat, 100.0, 4096, 1700000000.0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 3.0);  // (250 + 50) ticks at 100 per second
  EXPECT_DOUBLE_EQ(s->start_time_s, 1700000000.0 + 123.45);
  EXPECT_EQ(s->virtual_bytes, 1073741824u);
  EXPECT_EQ(s->resident_bytes, 2048u * 4096u);
}

TEST(ProcessStats, RejectsTextThatIsNotAStatLine) {
  EXPECT_EQ(ParseProcStat("no parenthesis here", 100, 4096, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStat("1 (a) S 1 2 3", 100, 4096, 1).status().code(),
            StatusCode::kInvalidArgument);
  std::string bad = kStat;
  bad.replace(bad.find(" 250 "), 5, " x50 ");
  EXPECT_EQ(ParseProcStat(bad, 100, 4096, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(ProcessStats, ReadsThisProcess) {
  const StatusOr<ProcessStats> s = ReadProcessStats();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GT(s->resident_bytes, 0u);
  EXPECT_GE(s->virtual_bytes, s->resident_bytes);
  EXPECT_GE(s->open_fds, 3u);  // stdin, stdout, stderr
  EXPECT_GE(s->max_fds, s->open_fds);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(s->start_time_s, now + 1);
  EXPECT_GT(s->start_time_s, now - 24 * 3600);
}

}  // namespace
}  // namespace stash::daemon

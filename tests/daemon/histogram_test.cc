// CumulativeHistogram: Prometheus "less or equal" buckets, cumulative counts, the sum.
#include "daemon/stats/histogram.h"

#include <gtest/gtest.h>

namespace stash::daemon {
namespace {

TEST(CumulativeHistogram, CountsEachValueInTheFirstBucketWhoseBoundHoldsIt) {
  CumulativeHistogram h({1, 10, 100});
  for (double v : {0.5, 1.0, 2.0, 10.0, 50.0, 1000.0}) h.Observe(v);
  const CumulativeHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.bounds, (std::vector<double>{1, 10, 100}));
  // <= 1: 0.5, 1; <= 10: + 2, 10; <= 100: + 50; +Inf: + 1000.
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{2, 4, 5, 6}));
  EXPECT_EQ(s.count, 6U);
  EXPECT_DOUBLE_EQ(s.sum, 1063.5);
}

TEST(CumulativeHistogram, IsEmptyBeforeTheFirstValue) {
  const CumulativeHistogram::Snapshot s = CumulativeHistogram({1}).Read();
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(s.count, 0U);
  EXPECT_EQ(s.sum, 0);
}

}  // namespace
}  // namespace stash::daemon

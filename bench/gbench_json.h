// Reads the results Google Benchmark writes with --benchmark_out_format=json, so stash-bench can
// put the in-process figures into its one table.
#ifndef STASH_BENCH_GBENCH_JSON_H_
#define STASH_BENCH_GBENCH_JSON_H_

#include <map>
#include <string>

#include "stash/status.h"

namespace stash::bench {

// Per benchmark run name (e.g. "BM_RingAllocFree/1024" or "BM_X/64_median"), its numeric fields
// ("real_time", "items_per_second", user counters, ...). String fields are kept in `text`.
struct GbenchRun {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> text;
};
using GbenchResults = std::map<std::string, GbenchRun>;

// Parses the JSON document; INVALID_ARGUMENT with the byte offset when it is not JSON.
StatusOr<GbenchResults> ParseGbenchJson(const std::string& json);

}  // namespace stash::bench

#endif  // STASH_BENCH_GBENCH_JSON_H_

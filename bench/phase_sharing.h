// stash-bench's sharing phase (docs/benchmarks.md §8): what one pool for all ranks of a node
// saves over a pool per rank, in the model (bench/sharing_model.h) and through a real stashd
// with 8 rank processes (bench/sharing_worker.h).
#ifndef STASH_BENCH_PHASE_SHARING_H_
#define STASH_BENCH_PHASE_SHARING_H_

#include <vector>

#include "bench/harness.h"
#include "bench/report.h"
#include "stash/status.h"

namespace stash::bench {

Status PhaseSharing(Env& env, std::vector<Row>& rows);

}  // namespace stash::bench

#endif  // STASH_BENCH_PHASE_SHARING_H_

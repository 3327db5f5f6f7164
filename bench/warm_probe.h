// The machine's own floor under the "first stash into warmed memory" rows (issue 24): memory
// warmed the way the daemon warms a tier (a fresh memfd, MADV_POPULATE_WRITE, each page written
// once through the mapping the copy uses: ChunkMemory::Populate), then copied into twice by a
// plain one-thread memcpy, no daemon involved (right after the daemon's first stash). Under some
// hypervisors the first copy into memory written moments ago still runs well below the second
// (docs/benchmarks.md §9); the daemon's first stash cannot beat what a memcpy gets here.
#ifndef STASH_BENCH_WARM_PROBE_H_
#define STASH_BENCH_WARM_PROBE_H_

#include <cstdint>

#include "stash/status.h"

namespace stash::bench {

struct WarmProbe {
  double first_gbps = 0;   // the first memcpy into the warmed memory
  double second_gbps = 0;  // the next one, into the same memory
};

// Copies `bytes` (> 0, a multiple of 8) from `src` into fresh memory warmed as above.
StatusOr<WarmProbe> ProbeFirstCopyIntoWarmedMemory(const uint8_t* src, uint64_t bytes);

}  // namespace stash::bench

#endif  // STASH_BENCH_WARM_PROBE_H_

// The machine's own floor under the "first stash into warmed memory" rows (issue 24): memory
// warmed the way the daemon warms a tier (a fresh memfd, MADV_POPULATE_WRITE, each page written
// once through the mapping the copy uses: ChunkMemory::Populate) while the daemon warms its
// tiers, then copied into twice by a plain one-thread memcpy, no daemon involved, right after
// the daemon's first stash. Under some hypervisors the first large copy after a second or more
// of rest runs well below the next one whatever memory it touches (docs/benchmarks.md §9); the
// daemon's first stash cannot beat what a memcpy gets there. The probe copies second, after that
// stash: read its ratio as the most the machine allowed, not the least.
#ifndef STASH_BENCH_WARM_PROBE_H_
#define STASH_BENCH_WARM_PROBE_H_

#include <cstdint>
#include <memory>

#include "stash/status.h"

namespace stash::bench {

struct WarmProbe {
  double first_gbps = 0;   // the first memcpy into the warmed memory
  double second_gbps = 0;  // the next one, into the same memory
};

// Fresh memory warmed as above when made; its first copies come later (Copy), so the probe's
// memory has aged as long as the memory the daemon's first stash lands in.
class WarmedMemory {
 public:
  static StatusOr<std::unique_ptr<WarmedMemory>> Make(uint64_t bytes);  // > 0, multiple of 8
  ~WarmedMemory();
  WarmedMemory(const WarmedMemory&) = delete;
  WarmedMemory& operator=(const WarmedMemory&) = delete;

  // Copies its `bytes` from `src` twice, timing each; fails if the bytes differ after.
  StatusOr<WarmProbe> Copy(const uint8_t* src);

 private:
  WarmedMemory(uint8_t* dst, uint64_t bytes) : dst_(dst), bytes_(bytes) {}
  uint8_t* dst_;
  uint64_t bytes_;
};

}  // namespace stash::bench

#endif  // STASH_BENCH_WARM_PROBE_H_

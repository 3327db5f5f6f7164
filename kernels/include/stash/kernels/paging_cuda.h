// CUDA kernels for the paging rules of paging.h (docs/design.md): daemon-copy's contract. The
// daemon launches them from its fatbin through the driver API (daemon/cuda/paging_kernels.h); the
// runtime launchers below serve the GPU tests and benchmarks; both run the bodies of
// daemon_paging.h. Every kernel calls the same STASH_HOST_DEVICE functions the host backend
// runs, so tests/kernels pins what the GPU does and tests/gpu compares the two byte for byte.
//
// A stash is three kernels, in this order, on the caller's stream:
//   1. plan (one thread): reads the count (a device int64, or a value given at launch), runs
//      PlanStashInOrder over the tiers given, in the order own device, peer, host (a tier with a
//      null ring is skipped; daemon-copy gives device and host, mapped mode all three), writes
//      the StashPlan to `d_plan`. Nothing else changes.
//   2. copy: a thread block per chunk (kChunkBytes, or the page when smaller) of each page slot;
//      its first thread reads the page id at ring slot plan.head + slot of the chosen tier once
//      (the first chunk of a page also writes the page record), and its threads copy the
//      chunk's 16-byte vectors (StashChunkVector). On kOverflow or kInvalidCount it does
//      nothing.
//   3. publish (one thread): head = plan.head + plan.pages in the chosen tier. Because it runs
//      after the copy kernel has finished, no copy thread can see the new head (the in-place head
//      race upstream hit, research/domain.md §2.2).
// A reload is two kernels: pop (a block per chunk reads its page id from the page record once and
// copies it back with PopChunkVector; the first chunk of a page returns it at ring slot
// tail + slot; then zeros over the tail when asked, ZeroTailVector) and publish
// (tail += plan.pages). The plan's placement picks the tier (kDevice, kPeer, kHost). A reload of
// a stash that overflowed copies the source the rank kept instead (d_kept_src), so a replayed
// graph reads the activation whether or not that replay's stash found room.
//
// Grids depend only on the static maximum max_rows * row_bytes, and counts, heads and tails are
// read from device memory, so both sequences can be captured in a CUDA graph and replayed.
//
// Memory: rings, their ids, tiers, page records and plans must be device-accessible (device
// memory, or mapped pinned host memory for the host tier). Rings and plans 16-byte aligned, page
// records 8-byte aligned. Source and destination buffers may have any alignment (unaligned ones
// are copied a byte at a time). Device pointers are prefixed `d_`.
//
// This header includes no CUDA header: cudaStream_t is declared below exactly as the runtime
// declares it (C++ allows repeating an identical typedef).
#ifndef STASH_KERNELS_PAGING_CUDA_H_
#define STASH_KERNELS_PAGING_CUDA_H_

#include <cstdint>

#include "stash/kernels/paging.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;  // NOLINT(modernize-use-using): must match the runtime

namespace stash::kernels {

// Why a launch did not happen (or failed when it was enqueued).
enum class LaunchStatus : uint32_t {
  kOk = 0,
  kNullPointer = 1,   // a required pointer is null (the message names it)
  kBadPageBytes = 2,  // page_bytes is not a power of two >= 16
  kBadRowBytes = 3,   // row_bytes is 0
  kBadTier = 4,       // exactly one of d_ring and d_base is set in the peer or host tier
  kMisaligned = 5,    // a ring or plan not 16-byte aligned, or a page record not 8-byte aligned
  kTooLarge = 6,      // max_rows * row_bytes does not fit in 64 bits
  kCudaError = 7,     // a CUDA call failed; `cuda_error` and the message say which
  kOverlap = 8,       // d_kept_src and d_dst overlap without being the same buffer
};

// The name of a status, e.g. "kBadPageBytes".
const char* LaunchStatusName(LaunchStatus status);

// The outcome of a CanImplement or Launch call.
struct LaunchResult {
  LaunchStatus status = LaunchStatus::kOk;
  int cuda_error = 0;      // when status == kCudaError: the cudaError_t (runtime launchers) or
                           // CUresult (daemon/cuda/paging_kernels.h); else 0
  char message[256] = {};  // empty when OK; else the bad argument, or for a CUDA error the call's
                           // expression, the CUDA error string, file and line
  bool ok() const { return status == LaunchStatus::kOk; }
};

// One tier as the kernels see it. Non-owning.
struct CudaTier {
  PageRing* d_ring = nullptr;  // the tier's free ring (its ids device-accessible too)
  uint8_t* d_base = nullptr;   // first byte of page 0 of the tier
};

// Everything one stash needs. Non-owning.
struct StashLaunch {
  const uint8_t* d_src = nullptr;    // byte 0 of the marked buffer (max_rows * row_bytes bytes)
  const int64_t* d_count = nullptr;  // the count, read when the plan kernel runs; nullptr = `count`
  int64_t count = 0;                 // the count when d_count is nullptr
  uint32_t divisor = 1;              // rows = ceil(count / divisor): 1 for data, 32 for columnwise
                                     // scale_inv; 0 = 1
  uint64_t max_rows = 0;             // static row budget of the buffer; more rows = overflow
  uint64_t row_bytes = 0;            // bytes per row; > 0
  uint64_t page_bytes = 0;           // bytes per page of both tiers; a power of two >= 16
  CudaTier device;                   // the session's own pool; required
  CudaTier peer;                     // mapped mode: chunks another GPU lent (tried second); both
                                     // pointers null = none
  CudaTier host;                     // the host spill tier (tried last); both null = no spill
  uint64_t* d_page_record = nullptr;  // PagesFor(max_rows * row_bytes) entries; the copy writes
                                      // the first plan.pages of them
  StashPlan* d_plan = nullptr;        // the plan kernel writes it; copy, publish and the stash's
                                      // reload read it; the caller may read it back
};

// Checks a stash launch without touching the GPU (CUTLASS can_implement): pointers, page size,
// row size, alignment, size overflow.
LaunchResult CanImplementStash(const StashLaunch& args);

// CanImplementStash, then enqueues plan, copy and publish on `stream`. OK means enqueued; the
// placement is in *d_plan once the stream reaches it (kOverflow / kInvalidCount: nothing taken,
// heads unchanged). The source must stay valid until then.
LaunchResult LaunchStash(const StashLaunch& args, cudaStream_t stream);

// Everything one reload (or release) needs. Non-owning.
struct ReloadLaunch {
  uint8_t* d_dst = nullptr;                 // byte 0 of the destination (max_rows * row_bytes
                                            // bytes); nullptr = release: return the pages and
                                            // copy nothing
  const StashPlan* d_plan = nullptr;        // the plan the stash's LaunchStash wrote
  const uint64_t* d_page_record = nullptr;  // the page record the stash's LaunchStash wrote
  uint64_t max_rows = 0;                    // as at stash time
  uint64_t row_bytes = 0;                   // as at stash time; > 0
  uint64_t page_bytes = 0;                  // as at stash time
  bool zero_tail = false;                   // also write zeros to bytes
                                            // [plan.bytes, max_rows * row_bytes) of d_dst
  // The stash's source, which the rank keeps when the stash overflows (mapped mode). When the
  // plan says kOverflow, its first min(rows, max_rows) rows are copied to d_dst (nothing when
  // they are the same buffer; buffers that partly overlap are refused: kOverlap) and zero_tail
  // zeroes past them. nullptr: an overflowed stash's
  // reload leaves d_dst as it is (daemon-copy, where an overflowed ticket is never reloaded).
  const uint8_t* d_kept_src = nullptr;
  CudaTier device;  // the same tiers as at stash time
  CudaTier peer;
  CudaTier host;
};

// Checks a reload launch without touching the GPU.
LaunchResult CanImplementReload(const ReloadLaunch& args);

// CanImplementReload, then enqueues pop (copy back, zero tail, return pages) and publish
// (tail += plan.pages) on `stream`. A plan that placed nothing returns no pages and leaves the
// tails: kInvalidCount leaves the destination as it is; kOverflow copies the kept source when
// d_kept_src is set (and zeroes the tail when asked), else leaves it too.
// Reload each placed stash exactly once.
LaunchResult LaunchReload(const ReloadLaunch& args, cudaStream_t stream);

}  // namespace stash::kernels

#endif  // STASH_KERNELS_PAGING_CUDA_H_

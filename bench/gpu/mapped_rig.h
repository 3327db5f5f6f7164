// The product's mapped-mode path on a GPU, set up for stash-bench-gpu's mapped-overlap and peer
// subcommands (docs/gpu-check.md, steps 5 and 6 of issue 23), the way
// tests/gpu/mapped_check_test.cc combines it: a VmmChunkMemory pool of VMM chunks on one GPU
// (the daemon's side; here in the same process, which changes nothing about the memory the
// kernels touch), each chunk exported as a POSIX fd and mapped by a CudaLeaseMemory of the rank's
// GPU into one lease tier (own device, or peer when the pool is on another GPU), and a
// StreamCopier whose only tier is that one, paging on one stream with the library's own fatbin.
//
// The driver API comes from CudaDriver::Get (dlopen of libcuda.so.1: the binary still links no
// libcuda), so the rig runs on the driver stand-in too (tests/bench/gpu/mapped_rig_test.cc).
// Create returns a Status; the Enqueue calls and EndStep exit the process (status 1, the error on
// stderr) when a call fails, as the benchmarks' Die does.
#ifndef STASH_BENCH_GPU_MAPPED_RIG_H_
#define STASH_BENCH_GPU_MAPPED_RIG_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "client/mapped/cuda/stream_copier.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "daemon/cuda/vmm_chunk_memory.h"
#include "stash/status.h"

namespace stash::bench_gpu {

using client::CudaLeaseMemory;
using client::StreamCopier;

struct MappedRigConfig {
  int device = 0;           // the rank's GPU (an ordinal of this process): the copier runs there
  int pool_device = 0;      // where the chunks live: `device` (device tier) or a peer (peer tier)
  uint64_t pool_bytes = 0;  // > 0; rounded up to whole chunks
  uint64_t chunk_bytes = 64 << 20;  // rounded up to the pool GPU's allocation granularity
  uint64_t page_bytes = 256 << 10;  // a power of two; divides the chunk size
  uint64_t max_stash_bytes = 0;     // the largest stash (> 0, at most the pool)
};

// Not thread-safe: one thread at a time (the StreamCopier's contract).
class MappedRig {
 public:
  // Sets everything up and enqueues the chunks' pages into the tier's ring on `stream` (a stream
  // of `device`, which the StreamCopier then pages on; it must outlive the rig). Returns when
  // that work completed. FAILED_PRECONDITION when the GPU cannot map the chunks (no VMM or
  // POSIX-fd handles; a peer it cannot access); another error for a failed driver call.
  static StatusOr<std::unique_ptr<MappedRig>> Create(const CudaDriver* driver,
                                                     const MappedRigConfig& config,
                                                     CUstream stream);
  MappedRig(const MappedRig&) = delete;
  MappedRig& operator=(const MappedRig&) = delete;
  // With the rank's context current: the copier synchronizes the stream first, then the lease
  // unmaps, then the pool frees.
  ~MappedRig();

  // Enqueues one stash of `bytes` (whole rows of 8 KiB, the count known on the host) from
  // `src` (device memory of `device`) with keep_source false (an overflow copies nothing and
  // raises the step's overflow flag), and its reload into `dst`. Dies on an error.
  void EnqueueStash(const void* src, uint64_t bytes, uint64_t* ticket);
  void EnqueueReload(uint64_t ticket, void* dst);
  void EnqueueRound(const void* src, void* dst, uint64_t bytes);
  // Enqueues a step boundary, waits for the stream and returns the flags of the step that ended
  // (kernels::kStepOverflow | kStepSpilled): what every stash since the last call did.
  uint64_t EndStep();

  uint32_t tier() const { return tier_; }
  // The tier's mapped memory, contiguous (every slot mapped): the same mapping the stashes use,
  // for a plain copy baseline through it. Device address.
  void* tier_base() const { return tier_base_; }
  uint64_t tier_bytes() const { return tier_bytes_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t page_bytes() const { return config_.page_bytes; }
  uint64_t chunks() const { return chunks_; }
  const std::string& pool_uuid() const { return pool_uuid_; }

 private:
  MappedRig(const CudaDriver* driver, const MappedRigConfig& config, CUstream stream)
      : driver_(driver), config_(config), stream_(stream) {}
  [[noreturn]] static void Fail(const Status& status, const char* what);

  const CudaDriver* const driver_;  // not owned
  const MappedRigConfig config_;
  const CUstream stream_;  // not owned
  uint32_t tier_ = 0;
  void* tier_base_ = nullptr;
  uint64_t tier_bytes_ = 0;
  uint64_t chunk_bytes_ = 0;
  uint64_t chunks_ = 0;
  uint64_t step_ = 0;
  std::string pool_uuid_;
  // Destroyed in reverse: the copier (it synchronizes the stream), the lease (unmaps), the pool.
  std::unique_ptr<PrimaryContext> context_;  // the rank's GPU's, retained for the rig's life
  std::unique_ptr<daemon::VmmChunkMemory> pool_;
  std::unique_ptr<CudaLeaseMemory> lease_;
  std::unique_ptr<StreamCopier> copier_;
};

}  // namespace stash::bench_gpu

#endif  // STASH_BENCH_GPU_MAPPED_RIG_H_

// The cuda backend's copy executor: one per visible GPU. Built only with STASH_ENABLE_CUDA.
// Everything goes through the CUDA driver API (common/cuda_driver.h), in each GPU's primary
// context, and the kernels come from the fatbin stashd carries (daemon/cuda/paging_kernels.h):
// stashd links no CUDA runtime, and the driver stand-in (tests/cuda_standin) runs the whole backend
// on a machine without a GPU.
//
// Per GPU: the pool (VMM chunks in one reserved range, or one cuMemAlloc where VMM is missing:
// addresses never move) and its page ring in device memory; this GPU's share of the host tier
// (--host-tier-bytes split evenly across GPUs, so no two GPUs' streams ever plan on one ring;
// memfd chunks page-locked for the GPU); both lend chunks to mapped sessions; one non-blocking copy
// stream; the stashes' plans and page records in device memory. Every stash, reload and release is
// enqueued on the copy stream (paging_cuda.h kernels: the count is read on the device, the tier and
// pages chosen on the device), then the plan is copied to pinned memory and a host function hands
// the continuation to the pool worker. Done events are 64-bit counters the stream raises after the
// kernels (a barrier and a 64-bit write, one cuStreamBatchMemOp); the trainer's stream waits on
// them with cuStreamWaitValue64, so neither side synchronises with the host in the steady state.
//
// Client memory: CUDA IPC handles (opened once per session, closed when the session's work
// finished) and host shared memory (registered with CUDA, mapped), where event counters live.
#ifndef STASH_DAEMON_CUDA_EXECUTOR_H_
#define STASH_DAEMON_CUDA_EXECUTOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "daemon/config/config.h"
#include "daemon/copy/executor.h"

namespace stash {
class PrimaryContext;
}  // namespace stash

namespace stash::daemon {

class PagingKernels;

// One executor per visible GPU, in device order; `uuids` gets each GPU's 16-byte UUID. `driver`:
// the driver table to use (nullptr: CudaDriver::Get(), the node's libcuda; tests pass the
// stand-in), borrowed for the executors' life. Errors name the GPU and the knob to change (e.g.
// --pool-bytes larger than the GPU's free memory).
// A CUDA failure the copy path cannot recover from on GPU `device` (an ordinal of stashd): a
// sticky context error (after which no queued kernel, host callback or done write ever runs) or
// a launch that validated arguments should have made impossible. The pool's pages went with the
// context, and answering the queued operations "OK" would be a lie, so stashd exits with status 3:
// every client's stream breaks at once, the client library raises its pending done events (no
// trainer stream hangs) and every Wait returns UNAVAILABLE; the service manager restarts it.
[[noreturn]] void DeviceLost(int device, const std::string& what);

StatusOr<std::vector<std::unique_ptr<CopyExecutor>>> CreateCudaExecutors(
    const DaemonConfig& config, const CudaDriver* driver, std::vector<std::string>* uuids);

// What the cuda backend's other parts (the groups' depots: daemon/cuda/cuda_group_block.h)
// borrow from one GPU's executor. Every pointer is valid while the executor lives.
struct CudaGpu {
  int device = 0;  // stashd's ordinal of the GPU, its pool's index
  const CudaDriver* driver = nullptr;
  const PrimaryContext* context = nullptr;  // the GPU's primary context
  CUstream stream = nullptr;                // the copy stream, shared with the pool worker
  const PagingKernels* kernels = nullptr;   // every launch on `stream` goes through it (its lock)
  std::string uuid;                         // the GPU's 16 raw UUID bytes (cuDeviceGetUuid)
};
// The GPU of `executor`; nullopt when it is not one of CreateCudaExecutors' executors.
std::optional<CudaGpu> CudaGpuOf(const CopyExecutor& executor);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CUDA_EXECUTOR_H_

// TEST AID, NEVER A BACKEND (see standin.h). What the stand-in's files share.
#ifndef STASH_TESTS_CUDA_STANDIN_INTERNAL_H_
#define STASH_TESTS_CUDA_STANDIN_INTERNAL_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace standin {

// The knobs, read from the environment at every cuInit (README.md lists them). The registry
// folder is fixed by the first cuInit of the process.
struct Config {
  int devices = 2;                   // STASH_STANDIN_DEVICES
  bool vmm = true;                   // off with STASH_STANDIN_NO_VMM=1
  bool posix_fd = true;              // off with STASH_STANDIN_NO_POSIX_FD=1
  bool peer = true;                  // off with STASH_STANDIN_NO_PEER=1
  uint64_t vram_bytes = 1ULL << 30;  // STASH_STANDIN_VRAM_BYTES, per device
  bool immediate = false;            // STASH_STANDIN_STREAMS=immediate
  int64_t stream_delay_us = 2000;    // STASH_STANDIN_STREAM_DELAY_US
  int64_t wait_timeout_ms = 10000;   // STASH_STANDIN_WAIT_TIMEOUT_MS
  int64_t launch_delay_us = 0;       // STASH_STANDIN_LAUNCH_DELAY_US
  std::string registry_dir;          // STASH_STANDIN_REGISTRY
};

// cuMemGetAllocationGranularity's answer, MINIMUM and RECOMMENDED alike (an H100/H200's value).
constexpr size_t kGranularity = size_t{2} << 20;
constexpr int kMaxDevices = 64;

// True once cuInit(0) succeeded in this process.
bool Initialized();
// The knobs; only read after Initialized().
const Config& config();
// Reads the knobs (device.cc, from cuInit).
void LoadConfig();

// Writes "cuda-standin: <fn>: <why>" to stderr and returns `code`: every refusal goes through it.
CUresult Fail(CUresult code, const char* fn, const std::string& why);
// Returns the CUresult of `expr` from the enclosing entry point when it is not CUDA_SUCCESS.
#define STANDIN_TRY(expr)                                        \
  do {                                                           \
    const CUresult standin_result_ = (expr);                     \
    if (standin_result_ != CUDA_SUCCESS) return standin_result_; \
  } while (0)

// Writes the message and aborts: for what would hang or corrupt on a GPU.
[[noreturn]] void Die(const std::string& why);

// CUDA_ERROR_NOT_INITIALIZED (with the message) before cuInit, else CUDA_SUCCESS.
CUresult RequireInit(const char* fn);
// The device of the calling thread's current context, or CUDA_ERROR_INVALID_CONTEXT.
CUresult CurrentDevice(const char* fn, int* device);
bool ValidDevice(int ordinal);

// The host address behind a stand-in device address (one address space stands in for all).
template <typename T = void>
T* HostPointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr): it is an address
}

// vmm.cc: true when every byte of [address, address + bytes) is mapped stand-in device memory
// (accessible or not: an access to memory without cuMemSetAccess faults when it runs) or
// registered host memory. Streams check the addresses of the work they take.
bool DeviceAddressable(uintptr_t address, size_t bytes);

// streams.cc: work a stream runs, in order, on its worker thread (or records while capturing).
using Op = std::function<void()>;
// Enqueues `op` on `stream`, or appends it to the stream's capture. CUDA_SUCCESS or the error
// (with its message): bad handle, no context for the null stream, invalidated capture, ...
// Work on a blocking stream also waits for the legacy stream's earlier work, and work on the
// legacy stream for every blocking stream's (the implicit synchronization of the legacy stream).
CUresult Enqueue(const char* fn, CUstream stream, Op op);
// Enqueue, but the work runs no earlier than kLateFactor stream delays from now: a copy the
// driver has started but "may not have completed" when the call returns (cuMemcpyHtoD from
// pageable memory), so that work queued after it on a stream that does not wait for it runs
// first, as it may on a GPU.
constexpr int kLateFactor = 3;
CUresult EnqueueLate(const char* fn, CUstream stream, Op op);
// A synchronous call (cuMemcpyHtoD, cuMemcpyDtoH) is one of the "potentially unsafe API calls"
// a capture may prohibit (cuThreadExchangeStreamCaptureMode): CUDA_SUCCESS, or the refusal, which
// invalidates the captures that prohibit it.
CUresult CheckSynchronousCall(const char* fn);

// vmm.cc: true when every byte of [address, address + bytes) is registered (page-locked) host
// memory (cuMemHostRegister, cuMemHostAlloc).
bool PinnedHost(uintptr_t address, size_t bytes);

}  // namespace standin

#endif  // STASH_TESTS_CUDA_STANDIN_INTERNAL_H_

// The client library's CUDA side (cuda backend only; internal): which cudaMalloc allocation a
// device pointer lies in and its IPC handle, host buffers mapped for the GPU, and the stream
// memory operations that order the trainer's stream against the daemon's copies.
//
// Everything goes through the driver API loaded at run time (common/cuda_driver.h) inside the
// device's primary context: the context PyTorch and the CUDA runtime use, so the library never
// creates a context of its own or links a second CUDA runtime into the trainer.
#ifndef STASH_CLIENT_CUDA_MEMORY_H_
#define STASH_CLIENT_CUDA_MEMORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/memory/allocation_table.h"
#include "stash/status.h"

namespace stash {
struct CudaDriver;  // common/cuda_driver.h
}  // namespace stash

namespace stash::client {

// Where a device pointer lives, in the terms RegisterMemory and MemoryRef use.
struct DeviceLocation {
  uint64_t memory_id = 0;  // this allocation's id in the session
  uint64_t offset = 0;     // pointer - allocation base
  std::string handle;      // the 64-byte IPC handle of the allocation base (exported once)
  uint64_t bytes = 0;      // the allocation's size
  // Allocations this one's range overlaps, so they were freed since: the caller unregisters
  // them (the daemon must not keep freed memory open).
  std::vector<uint64_t> stale_memory_ids;
};

// Thread-safe.
class CudaSide {
 public:
  // Loads the driver and retains `device`'s primary context. FAILED_PRECONDITION when there is
  // no driver or no such device (the message says what to check).
  static StatusOr<std::unique_ptr<CudaSide>> Open(int device);
  ~CudaSide();
  CudaSide(const CudaSide&) = delete;
  CudaSide& operator=(const CudaSide&) = delete;

  int device() const { return device_; }
  // The device's UUID, 16 raw bytes.
  const std::string& uuid() const { return uuid_; }

  // The allocation holding [pointer, pointer + bytes). INVALID_ARGUMENT for host, managed or
  // VMM (expandable_segments) memory, another GPU's memory, or a range that runs past its
  // allocation; the message says why and what to change. `what` names the argument.
  StatusOr<DeviceLocation> Locate(const void* pointer, uint64_t bytes, const char* what);
  // Forgets the allocation holding `pointer`; returns its memory id, 0 when it was never used.
  uint64_t Forget(const void* pointer);
  // Forgets every allocation; returns their memory ids.
  std::vector<uint64_t> ForgetAll();

  // Registers host memory for device access (portable, device-mapped) and returns its device
  // address. `owner` keeps the memory mapped. Call `*release` when the owner frees the memory:
  // streams may still wait on counters there, so it stays mapped and registered (`owner` is
  // kept) until the process exits instead of being unregistered under a waiting stream.
  StatusOr<uint64_t> MapHost(void* data, uint64_t bytes, std::shared_ptr<void> owner,
                             std::function<void()>* release);

  // Enqueues on `stream` (a CUstream / cudaStream_t; null = the legacy default stream): write
  // `value` to the 8 bytes at `address` after the stream's earlier work, or wait until they
  // reach `value` before its later work.
  Status WriteValue(void* stream, uint64_t address, uint64_t value);
  Status WaitValue(void* stream, uint64_t address, uint64_t value);

 private:
  CudaSide() = default;

  // (Unused in a library built without CUDA, whose twin, cuda_memory_none.cc, touches none.)
  [[maybe_unused]] const CudaDriver* driver_ = nullptr;
  int device_ = 0;
  std::string uuid_;
  [[maybe_unused]] void* context_ = nullptr;  // CUcontext: the primary context (retained)

  std::mutex mu_;
  AllocationTable allocations_;  // guarded by mu_
};

}  // namespace stash::client

#endif  // STASH_CLIENT_CUDA_MEMORY_H_

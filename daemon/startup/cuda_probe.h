// The one place the daemon asks the CUDA driver anything before the CUDA backend exists: whether
// a device answers, how many, and how much memory each has free. Built without CUDA, each says
// none (no device, 0, nothing filled in).
#ifndef STASH_DAEMON_CUDA_PROBE_H_
#define STASH_DAEMON_CUDA_PROBE_H_

#include <string>

#include "daemon/startup/memory_fit.h"

namespace stash::daemon {

// Whether a CUDA device answers (cuDeviceGetCount > 0). `why` says what was found.
bool CudaDeviceAnswers(std::string* why);

// How many CUDA devices answer; 0 without CUDA or a driver.
int CudaDeviceCount();

// Fills gpu_free_bytes (cuMemGetInfo) and gpu_uuids of each visible GPU; nothing without CUDA.
void ReadCudaMemory(FreeMemory* free);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CUDA_PROBE_H_

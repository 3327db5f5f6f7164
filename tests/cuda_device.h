// For the test files also built as `gpu`-labelled tests against the real driver: the driver, if
// it loads and sees a device. Those tests skip without one (GTEST_SKIP with `why`); their
// CPU builds run on the driver stand-in instead and never call this.
#ifndef STASH_TESTS_CUDA_DEVICE_H_
#define STASH_TESTS_CUDA_DEVICE_H_

#include <cuda.h>

#include <string>

#include "common/cuda_driver.h"

namespace stash::testing {

// The process's CUDA driver, initialized, when it sees at least one device; else null, with
// what is missing in `why`.
inline const CudaDriver* DriverWithADevice(std::string* why) {
  auto driver = CudaDriver::Get();
  if (!driver.ok()) {
    *why = "no CUDA device: " + driver.status().ToString();
    return nullptr;
  }
  int count = 0;
  if ((*driver)->Init(0) != CUDA_SUCCESS || (*driver)->DeviceGetCount(&count) != CUDA_SUCCESS ||
      count == 0) {
    *why = "no CUDA device";
    return nullptr;
  }
  return *driver;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_CUDA_DEVICE_H_

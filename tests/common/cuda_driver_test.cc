// The CUDA driver table: every entry point the backend uses resolves against the toolkit's stub
// libcuda, and a missing library or symbol says what to install.
#include "common/cuda_driver.h"

#include <gtest/gtest.h>

namespace stash {
namespace {

TEST(CudaDriver, EveryEntryPointResolvesInTheToolkitsStubLibrary) {
  auto driver = CudaDriver::Load(STASH_CUDA_STUB_LIBRARY);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  const CudaDriver& d = **driver;
  const void* entries[] = {
      reinterpret_cast<const void*>(d.Init),
      reinterpret_cast<const void*>(d.GetErrorName),
      reinterpret_cast<const void*>(d.GetErrorString),
      reinterpret_cast<const void*>(d.DeviceGet),
      reinterpret_cast<const void*>(d.DeviceGetCount),
      reinterpret_cast<const void*>(d.DeviceGetAttribute),
      reinterpret_cast<const void*>(d.DeviceGetUuid),
      reinterpret_cast<const void*>(d.CtxPushCurrent),
      reinterpret_cast<const void*>(d.CtxPopCurrent),
      reinterpret_cast<const void*>(d.DevicePrimaryCtxRetain),
      reinterpret_cast<const void*>(d.DevicePrimaryCtxRelease),
      reinterpret_cast<const void*>(d.PointerGetAttributes),
      reinterpret_cast<const void*>(d.MemGetAddressRange),
      reinterpret_cast<const void*>(d.IpcGetMemHandle),
      reinterpret_cast<const void*>(d.MemHostRegister),
      reinterpret_cast<const void*>(d.MemHostUnregister),
      reinterpret_cast<const void*>(d.MemHostGetDevicePointer),
      reinterpret_cast<const void*>(d.StreamWaitValue64),
      reinterpret_cast<const void*>(d.StreamBatchMemOp),
  };
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); ++i) {
    EXPECT_NE(entries[i], nullptr) << "entry " << i;
  }
  EXPECT_TRUE(d.Check(CUDA_SUCCESS, "cuInit(0)").ok());
  const Status failed = d.Check(CUDA_ERROR_INVALID_VALUE, "cuMemGetAddressRange(&b, &n, p)");
  EXPECT_EQ(failed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.message().find("cuMemGetAddressRange(&b, &n, p) failed"), std::string::npos)
      << failed.message();
  EXPECT_EQ(d.Check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc").code(), StatusCode::kResourceExhausted);
}

TEST(CudaDriver, AMissingLibraryNamesItAndTheDriver) {
  auto driver = CudaDriver::Load("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(driver.status().message().find("/nonexistent/libcuda.so.1"), std::string::npos);
  EXPECT_NE(driver.status().message().find("NVIDIA driver"), std::string::npos);
}

TEST(CudaDriver, ALibraryWithoutTheEntryPointsNamesTheFirstMissingOne) {
  auto driver = CudaDriver::Load("libc.so.6");
  ASSERT_FALSE(driver.ok());
  EXPECT_NE(driver.status().message().find("has no cuInit"), std::string::npos)
      << driver.status().message();
}

}  // namespace
}  // namespace stash

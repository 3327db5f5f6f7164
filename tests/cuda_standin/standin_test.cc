// Tests of the CUDA driver stand-in (TEST AID, NEVER A BACKEND): loaded through the project's
// driver table, every contract it enforces is shown refusing or faulting.
#include <gtest/gtest.h>

#include "common/cuda_driver.h"
#include "standin.h"

namespace stash {
namespace {

TEST(CudaStandin, EveryEntryPointOfTheDriverTableResolves) {
  auto driver = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
}

}  // namespace
}  // namespace stash

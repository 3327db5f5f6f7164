// TEST AID, NEVER A BACKEND (see standin.h). Registers the host twins of mapped mode's kernels
// (kernels/include/stash/kernels/mapped_paging.h) with the driver stand-in, so StreamCopier's
// launches run them: one copy for every test that drives StreamCopier on the stand-in.
#ifndef STASH_TESTS_CUDA_STANDIN_MAPPED_TWINS_H_
#define STASH_TESTS_CUDA_STANDIN_MAPPED_TWINS_H_

#include <dlfcn.h>

#include <cstddef>

#include "common/cuda_driver.h"
#include "standin.h"
#include "stash/kernels/mapped_paging.h"

namespace stash::testing {

template <typename Args, void (*Body)(const Args&)>
void MappedTwin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  Body(*static_cast<const Args*>(params[0]));
}

// True once every kernel of the fatbin has its twin in the stand-in `driver` loaded.
inline bool RegisterMappedTwins(const CudaDriver* driver) {
  using kernels::MappedReloadArgs;
  using kernels::MappedRingArgs;
  using kernels::MappedStashArgs;
  using kernels::MappedStepArgs;
  auto reg = reinterpret_cast<decltype(&stash_standin_register_kernel)>(
      dlsym(driver->library, "stash_standin_register_kernel"));
  if (reg == nullptr) return false;
  const size_t stash = sizeof(MappedStashArgs);
  const size_t reload = sizeof(MappedReloadArgs);
  const size_t step = sizeof(MappedStepArgs);
  const size_t ring = sizeof(MappedRingArgs);
  return reg(kernels::kStashPlanKernel, MappedTwin<MappedStashArgs, kernels::PlanMappedStashSlot>,
             1, &stash) == 0 &&
         reg(kernels::kStashCopyKernel, MappedTwin<MappedStashArgs, kernels::MappedStashCopySerial>,
             1, &stash) == 0 &&
         reg(kernels::kStashPublishKernel, MappedTwin<MappedStashArgs, kernels::PublishMappedStash>,
             1, &stash) == 0 &&
         reg(kernels::kReloadPopKernel,
             MappedTwin<MappedReloadArgs, kernels::MappedReloadPopSerial>, 1, &reload) == 0 &&
         reg(kernels::kReloadPublishKernel,
             MappedTwin<MappedReloadArgs, kernels::PublishMappedReload>, 1, &reload) == 0 &&
         reg(kernels::kStepKernel, MappedTwin<MappedStepArgs, kernels::MappedStep>, 1, &step) ==
             0 &&
         reg(kernels::kAddPagesKernel, MappedTwin<MappedRingArgs, kernels::AddMappedPages>, 1,
             &ring) == 0 &&
         reg(kernels::kRemoveChunkKernel, MappedTwin<MappedRingArgs, kernels::RemoveMappedChunk>, 1,
             &ring) == 0;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_CUDA_STANDIN_MAPPED_TWINS_H_

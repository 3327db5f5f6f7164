// TEST AID, NEVER A BACKEND (see standin.h). Registers the host twins of daemon-copy's kernels
// (kernels/include/stash/kernels/daemon_paging.h) with the driver stand-in, so the daemon's
// cuda backend (daemon/paging_kernels.h) runs them: one copy for every test that drives it on
// the stand-in.
#ifndef STASH_TESTS_CUDA_STANDIN_DAEMON_TWINS_H_
#define STASH_TESTS_CUDA_STANDIN_DAEMON_TWINS_H_

#include <dlfcn.h>

#include <cstddef>

#include "common/cuda_driver.h"
#include "standin.h"
#include "stash/kernels/daemon_paging.h"

namespace stash::testing {

template <typename Args, void (*Body)(const Args&)>
void DaemonTwin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  Body(*static_cast<const Args*>(params[0]));
}

// True once every kernel of daemon-copy's fatbin has its twin in the stand-in `driver` loaded.
inline bool RegisterDaemonTwins(const CudaDriver* driver) {
  using kernels::ReloadLaunch;
  using kernels::StashLaunch;
  auto reg = reinterpret_cast<decltype(&stash_standin_register_kernel)>(
      dlsym(driver->library, "stash_standin_register_kernel"));
  if (reg == nullptr) return false;
  const size_t stash = sizeof(StashLaunch);
  const size_t reload = sizeof(ReloadLaunch);
  return reg(kernels::kDaemonStashPlanKernel, DaemonTwin<StashLaunch, kernels::PlanStashLaunch>, 1,
             &stash) == 0 &&
         reg(kernels::kDaemonStashCopyKernel, DaemonTwin<StashLaunch, kernels::StashCopySerial>, 1,
             &stash) == 0 &&
         reg(kernels::kDaemonStashPublishKernel,
             DaemonTwin<StashLaunch, kernels::PublishStashLaunch>, 1, &stash) == 0 &&
         reg(kernels::kDaemonReloadPopKernel, DaemonTwin<ReloadLaunch, kernels::ReloadPopSerial>, 1,
             &reload) == 0 &&
         reg(kernels::kDaemonReloadPublishKernel,
             DaemonTwin<ReloadLaunch, kernels::PublishReloadLaunch>, 1, &reload) == 0;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_CUDA_STANDIN_DAEMON_TWINS_H_

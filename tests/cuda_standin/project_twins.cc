// TEST AID, NEVER A BACKEND (see standin.h). The host twins of the project's two kernel sets,
// registered when the stand-in is loaded, as a GPU driver finds the kernels in the fatbin image
// a process loads: mapped mode's (kernels/mapped_paging.cu, bodies in
// stash/kernels/mapped_paging.h), which the client library launches, and daemon-copy's
// (kernels/daemon_paging.cu, bodies in stash/kernels/daemon_paging.h and, for the group depots,
// stash/kernels/group_kernels.h), which stashd's cuda backend launches. So any process that loads
// the stand-in (a test, or stashd itself started with the stand-in as its libcuda.so.1) runs them.
#include <cstddef>

#include "standin.h"
#include "stash/kernels/daemon_paging.h"
#include "stash/kernels/group_kernels.h"
#include "stash/kernels/mapped_paging.h"

namespace {

using stash::kernels::ChunkRingLaunch;
using stash::kernels::GroupDepotLaunch;
using stash::kernels::MappedReloadArgs;
using stash::kernels::MappedRingArgs;
using stash::kernels::MappedStashArgs;
using stash::kernels::MappedStepArgs;
using stash::kernels::ReloadLaunch;
using stash::kernels::StashLaunch;

// The twin of a kernel whose one parameter is an `Args` by value: `Body` on it.
template <typename Args, void (*Body)(const Args&)>
void Twin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  Body(*static_cast<const Args*>(params[0]));
}

template <typename Args, void (*Body)(const Args&)>
void Register(const char* name) {
  const size_t size = sizeof(Args);
  if (stash_standin_register_kernel(name, Twin<Args, Body>, 1, &size) != 0) __builtin_trap();
}

struct RegisterProjectTwins {
  RegisterProjectTwins() {
    namespace k = stash::kernels;
    Register<MappedStashArgs, k::PlanMappedStashSlot>(k::kStashPlanKernel);
    Register<MappedStashArgs, k::MappedStashCopySerial>(k::kStashCopyKernel);
    Register<MappedStashArgs, k::PublishMappedStash>(k::kStashPublishKernel);
    Register<MappedReloadArgs, k::MappedReloadPopSerial>(k::kReloadPopKernel);
    Register<MappedReloadArgs, k::PublishMappedReload>(k::kReloadPublishKernel);
    Register<MappedStepArgs, k::MappedStep>(k::kStepKernel);
    Register<MappedRingArgs, k::AddMappedPages>(k::kAddPagesKernel);
    Register<MappedRingArgs, k::RemoveMappedChunk>(k::kRemoveChunkKernel);

    Register<StashLaunch, k::PlanStashLaunch>(k::kDaemonStashPlanKernel);
    Register<StashLaunch, k::StashCopySerial>(k::kDaemonStashCopyKernel);
    Register<StashLaunch, k::PublishStashLaunch>(k::kDaemonStashPublishKernel);
    Register<ReloadLaunch, k::ReloadPopSerial>(k::kDaemonReloadPopKernel);
    Register<ReloadLaunch, k::PublishReloadLaunch>(k::kDaemonReloadPublishKernel);
    Register<ChunkRingLaunch, k::TakeChunksLaunch>(k::kDaemonTakeChunksKernel);
    Register<ChunkRingLaunch, k::ReturnChunkLaunch>(k::kDaemonReturnChunkKernel);
    Register<GroupDepotLaunch, k::GroupJoinLaunch>(k::kDaemonGroupJoinKernel);
    Register<GroupDepotLaunch, k::GroupTakeLaunch>(k::kDaemonGroupTakeKernel);
    Register<GroupDepotLaunch, k::GroupOutLaunch>(k::kDaemonGroupOutKernel);
    Register<GroupDepotLaunch, k::GroupReclaimSerial>(k::kDaemonGroupReclaimKernel);
    Register<GroupDepotLaunch, k::GroupResetHighWaterLaunch>(k::kDaemonGroupResetHighWaterKernel);
  }
};

const RegisterProjectTwins kRegistered;

}  // namespace

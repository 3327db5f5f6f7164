// stash-bench-gpu's mapped-mode rig (see mapped_rig.h).
#include "bench/gpu/mapped_rig.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "common/macros.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/mapped_paging_fatbin.h"

namespace stash::bench_gpu {
namespace {

constexpr uint64_t kRowBytes = 8 << 10;

// A device address as the driver API spells it.
CUdeviceptr Address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

// Like Die (bench/gpu/common.h), without the CUDA runtime: the rig is tested on the driver
// stand-in.
void MappedRig::Fail(const Status& status, const char* what) {
  std::fprintf(stderr, "stash-bench-gpu: mapped rig: %s: %s\n", what, status.ToString().c_str());
  std::fflush(stderr);
  std::exit(1);
}

StatusOr<std::unique_ptr<MappedRig>> MappedRig::Create(const CudaDriver* driver,
                                                       const MappedRigConfig& config,
                                                       CUstream stream) {
  if (config.pool_bytes == 0 || config.max_stash_bytes == 0 ||
      config.max_stash_bytes % kRowBytes != 0) {
    return InvalidArgumentError("the rig needs a pool and a largest stash of whole 8 KiB rows");
  }
  std::unique_ptr<MappedRig> rig(new MappedRig(driver, config, stream));
  rig->tier_ = config.pool_device == config.device ? kernels::kLeaseDevice : kernels::kLeasePeer;
  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(driver, config.device));
  rig->context_ = std::make_unique<PrimaryContext>(std::move(context));
  const PrimaryContext::Scope scope(*rig->context_);
  STASH_RETURN_IF_ERROR(scope.status());

  // The pool: whole chunks, every chunk present. VmmChunkMemory checks VMM and POSIX-fd support
  // first (FAILED_PRECONDITION naming the GPU) and rounds the chunk up to the GPU's granularity:
  // a chunk size that is not a whole number of it is refused here rather than measured.
  const uint64_t chunk = config.chunk_bytes;
  if (chunk == 0 || chunk % config.page_bytes != 0) {
    return InvalidArgumentError("a chunk of " + std::to_string(chunk) + " bytes is not whole " +
                                std::to_string(config.page_bytes) + "-byte pages");
  }
  const uint64_t chunks = (std::max(config.pool_bytes, config.max_stash_bytes) + chunk - 1) / chunk;
  STASH_ASSIGN_OR_RETURN(rig->pool_,
                         daemon::VmmChunkMemory::Create(driver, config.pool_device, "bench pool",
                                                        chunks * chunk, chunk, config.page_bytes));
  daemon::VmmChunkMemory& pool = *rig->pool_;
  if (pool.chunk_bytes() != chunk || pool.chunks() != chunks) {
    return InvalidArgumentError("chunks of " + std::to_string(chunk) +
                                " bytes are not a whole number of the pool GPU's "
                                "allocation granularity (" +
                                std::to_string(pool.granularity()) + " bytes)");
  }
  for (uint64_t c = 0; c < chunks; ++c) STASH_RETURN_IF_ERROR(pool.Ensure(c));
  rig->chunk_bytes_ = chunk;
  rig->chunks_ = chunks;
  rig->pool_uuid_ = pool.uuid();

  // The rank's lease ranges: the tier in use holds every chunk; the others one empty slot.
  std::array<uint64_t, kernels::kLeaseTiers> tier_bytes{chunk, chunk, chunk};
  tier_bytes[rig->tier_] = chunks * chunk;
  STASH_ASSIGN_OR_RETURN(rig->lease_,
                         CudaLeaseMemory::Create(driver, config.device, chunk, tier_bytes));
  CudaLeaseMemory& lease = *rig->lease_;
  for (uint64_t c = 0; c < chunks; ++c) {
    STASH_ASSIGN_OR_RETURN(UniqueFd fd, pool.ExportFd(c));
    STASH_RETURN_IF_ERROR(
        lease.Map(rig->tier_, c, std::move(fd), pool.ChunkBytes(c), config.pool_device));
  }
  rig->tier_base_ = lease.base(rig->tier_);
  rig->tier_bytes_ = chunks * chunk;

  // The copier: only this tier (the others have no slots), no host spill.
  StreamCopier::Geometry g;
  g.page_bytes = config.page_bytes;
  g.chunk_bytes = chunk;
  g.tier_base[rig->tier_] = Address(lease.base(rig->tier_));
  g.tier_slots[rig->tier_] = chunks;
  g.allow_host = false;
  g.max_stashes = 8;
  g.record_pages = 2 * kernels::PagesFor(config.max_stash_bytes, config.page_bytes);
  STASH_ASSIGN_OR_RETURN(rig->copier_, StreamCopier::Create(driver, g, stash_mapped_paging_fatbin));
  for (uint64_t c = 0; c < chunks; ++c) {
    STASH_RETURN_IF_ERROR(rig->copier_->AddChunk(stream, rig->tier_, c, pool.ChunkBytes(c)));
  }
  STASH_RETURN_IF_ERROR(driver->Check(driver->StreamSynchronize(stream), "cuStreamSynchronize"));
  return rig;
}

MappedRig::~MappedRig() {
  if (context_ == nullptr) return;
  const PrimaryContext::Scope scope(*context_);
  copier_.reset();
  lease_.reset();
  pool_.reset();
}

void MappedRig::EnqueueStash(const void* src, uint64_t bytes, uint64_t* ticket) {
  const PrimaryContext::Scope scope(*context_);
  if (!scope.status().ok()) Fail(scope.status(), "making the GPU's context current");
  StreamCopier::StashRequest request;
  request.src = src;
  request.count = static_cast<int64_t>(bytes / kRowBytes);
  request.max_rows = bytes / kRowBytes;
  request.row_bytes = kRowBytes;
  request.keep_source = false;
  StatusOr<uint64_t> stashed = copier_->Stash(stream_, request);
  if (!stashed.ok()) Fail(stashed.status(), "StreamCopier::Stash");
  *ticket = *stashed;
}

void MappedRig::EnqueueReload(uint64_t ticket, void* dst) {
  const PrimaryContext::Scope scope(*context_);
  if (!scope.status().ok()) Fail(scope.status(), "making the GPU's context current");
  const Status reloaded = copier_->Reload(stream_, ticket, dst, false);
  if (!reloaded.ok()) Fail(reloaded, "StreamCopier::Reload");
}

void MappedRig::EnqueueRound(const void* src, void* dst, uint64_t bytes) {
  uint64_t ticket = 0;
  EnqueueStash(src, bytes, &ticket);
  EnqueueReload(ticket, dst);
}

uint64_t MappedRig::EndStep() {
  const PrimaryContext::Scope scope(*context_);
  if (!scope.status().ok()) Fail(scope.status(), "making the GPU's context current");
  const Status stepped = copier_->BeginStep(stream_, ++step_);
  if (!stepped.ok()) Fail(stepped, "StreamCopier::BeginStep");
  const Status synced = driver_->Check(driver_->StreamSynchronize(stream_), "cuStreamSynchronize");
  if (!synced.ok()) Fail(synced, "waiting for the step kernel");
  const StreamCopier::StepFlagsReport report = copier_->LastStep();
  if (report.step != step_) {
    Fail(InternalError("it reported step " + std::to_string(report.step) +
                       " after the stream completed step " + std::to_string(step_)),
         "the step kernel");
  }
  return report.flags;
}

}  // namespace stash::bench_gpu

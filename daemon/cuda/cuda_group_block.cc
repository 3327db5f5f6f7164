#include "daemon/cuda/cuda_group_block.h"

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <utility>

#include "common/bytes.h"
#include "common/cuda_vmm.h"
#include "common/logging.h"
#include "common/macros.h"
#include "daemon/cuda/cuda_buffer.h"

namespace stash::daemon {
namespace {

namespace k = stash::kernels;

// The pinned mailbox of a depot: the kernels' answer, the header's counters as read, then a
// staging area (the header written once, one chunk's tags read back).
constexpr uint64_t kAnswerOffset = 0;
constexpr uint64_t kCountersOffset = 64;
constexpr uint64_t kStagingOffset = 128;

// The members' counters the daemon reads, contiguous in the header.
constexpr uint64_t kCounterWords = 4;
static_assert(offsetof(k::GroupHeader, claimed_high_water) ==
                      offsetof(k::GroupHeader, claimed) + 8 &&
                  offsetof(k::GroupHeader, dry) == offsetof(k::GroupHeader, claimed) + 16 &&
                  offsetof(k::GroupHeader, dry_pages) == offsetof(k::GroupHeader, claimed) + 24,
              "Read copies claimed, claimed_high_water, dry and dry_pages in one go");

// `status` with `context` in front of its message, its code kept.
Status Annotate(const Status& status, const std::string& context) {
  if (status.ok()) return status;
  return {status.code(), context + ": " + status.message()};
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

template <typename T>
T* At(CUdeviceptr base, uint64_t offset) {
  return reinterpret_cast<T*>(base + offset);  // NOLINT(performance-no-int-to-ptr): device address
}

}  // namespace

// One GPU's depot: its allocation, mapped in stashd, and what the daemon needs to change it.
struct CudaGroupBlock::Depot {
  Depot() = default;
  Depot(const Depot&) = delete;
  Depot& operator=(const Depot&) = delete;
  ~Depot() {
    if (gpu.driver == nullptr) return;
    const CudaDriver* d = gpu.driver;
    const PrimaryContext::Scope scope(*gpu.context);
    if (!scope.status().ok()) return;  // the context is gone, and with it the depot
    // Every launch and copy was waited for: nothing of ours is queued. A member that still maps
    // the depot keeps its memory alive (the driver frees it with the last reference).
    auto warn = [d](CUresult r, const char* call) {
      const Status st = d->Check(r, call);
      if (!st.ok()) Log("pool")->warn("releasing a group depot: {}", st.message());
    };
    if (reached != nullptr) warn(d->EventDestroy(reached), "cuEventDestroy");
    if (mapped) warn(d->MemUnmap(base, bytes), "cuMemUnmap");
    if (base != 0) warn(d->MemAddressFree(base, bytes), "cuMemAddressFree");
    if (handle != 0) warn(d->MemRelease(handle), "cuMemRelease");
  }

  // With the context current: waits until the copy stream ran what was enqueued so far.
  Status Reach() const {
    STASH_CU_RETURN_IF_ERROR(gpu.driver, EventRecord(reached, gpu.stream));
    STASH_CU_RETURN_IF_ERROR(gpu.driver, EventSynchronize(reached));
    return Status::Ok();
  }
  std::string Name() const { return "the group depot on gpu" + std::to_string(gpu.device); }
  uint64_t* answer() const { return mailbox.host<uint64_t>() + kAnswerOffset / 8; }
  uint64_t* d_answer() const { return mailbox.device<uint64_t>() + kAnswerOffset / 8; }
  uint64_t* counters() const { return mailbox.host<uint64_t>() + kCountersOffset / 8; }
  uint8_t* staging() const { return mailbox.host<uint8_t>() + kStagingOffset; }

  CudaGpu gpu;
  uint64_t bytes = 0;  // the allocation: the layout's size rounded up to the granularity
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr base = 0;
  bool mapped = false;
  CUevent reached = nullptr;
  k::GroupView view{};               // device addresses of the depot's parts
  CudaBuffer mailbox;                // pinned, device-mapped
  std::unique_ptr<CudaBuffer> live;  // pinned, device-mapped: the live tags, sorted
  uint64_t live_capacity = 0;        // tags `live` holds
};

CudaGroupBlock::CudaGroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers)
    : GroupBlock(chunk_pages, tiers), host_depot_(chunks_, -1) {
  for (const TierShape& t : tiers) {
    tier_pool_.push_back(t.pool);
    tier_chunks_.push_back(t.chunks);
  }
}

CudaGroupBlock::~CudaGroupBlock() = default;

StatusOr<std::unique_ptr<GroupBlock>> CudaGroupBlock::Create(const std::vector<CudaGpu>& gpus,
                                                             uint64_t page_bytes,
                                                             uint64_t chunk_pages,
                                                             const std::vector<TierShape>& tiers) {
  STASH_RETURN_IF_ERROR(CheckTiers(tiers));
  if (gpus.empty()) return FailedPreconditionError("a group's depots need at least one GPU");
  if (chunk_pages == 0) return InvalidArgumentError("a group depot needs chunks of >= 1 page");
  for (const TierShape& t : tiers) {
    if (t.pool >= static_cast<int64_t>(gpus.size())) {
      return FailedPreconditionError("a group depot's tier is pool " + std::to_string(t.pool) +
                                     ", but only " + std::to_string(gpus.size()) +
                                     " GPUs have depots");
    }
  }
  std::unique_ptr<CudaGroupBlock> b(new CudaGroupBlock(chunk_pages, tiers));
  const k::GroupHeader header = b->HeaderFor(page_bytes, tiers);
  const k::GroupLayout& l = b->layout_;
  const uint64_t staging = std::max<uint64_t>(sizeof(header), chunk_pages * sizeof(uint32_t));
  for (const CudaGpu& gpu : gpus) {
    auto depot = std::make_unique<Depot>();
    Depot& d = *depot;
    const CudaDriver* driver = gpu.driver;
    if (driver == nullptr || gpu.context == nullptr || gpu.kernels == nullptr) {
      return InvalidArgumentError("gpu" + std::to_string(gpu.device) +
                                  " lends a group depot no driver, context or kernels");
    }
    const std::string name = "the group depot on gpu" + std::to_string(gpu.device);
    STASH_ASSIGN_OR_RETURN(const std::string missing, MissingChunkSupport(driver, gpu.device));
    if (!missing.empty()) {
      return FailedPreconditionError(name + ": the GPU supports no " + missing +
                                     ", which a group's depot needs (members map it as a file "
                                     "descriptor)");
    }
    const PrimaryContext::Scope scope(*gpu.context);
    STASH_RETURN_IF_ERROR(Annotate(scope.status(), name));
    d.gpu = gpu;  // from here on, ~Depot releases what was made
    const CUmemAllocationProp prop = ChunkAllocationProp(gpu.device);
    size_t granularity = 0;
    STASH_RETURN_IF_ERROR(
        Annotate(driver->Check(driver->MemGetAllocationGranularity(
                                   &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                               "cuMemGetAllocationGranularity"),
                 name));
    if (granularity == 0) granularity = 1;
    d.bytes = (l.block_bytes + granularity - 1) / granularity * granularity;
    STASH_RETURN_IF_ERROR(
        Annotate(driver->Check(driver->MemCreate(&d.handle, d.bytes, &prop, 0), "cuMemCreate"),
                 name + " (" + FormatBytes(d.bytes) + ")"));
    STASH_RETURN_IF_ERROR(
        Annotate(driver->Check(driver->MemAddressReserve(&d.base, d.bytes, granularity, 0, 0),
                               "cuMemAddressReserve"),
                 name));
    STASH_RETURN_IF_ERROR(
        Annotate(driver->Check(driver->MemMap(d.base, d.bytes, 0, d.handle, 0), "cuMemMap"), name));
    d.mapped = true;
    const CUmemAccessDesc access = ReadWriteAccess(gpu.device);
    STASH_RETURN_IF_ERROR(Annotate(
        driver->Check(driver->MemSetAccess(d.base, d.bytes, &access, 1), "cuMemSetAccess"), name));
    STASH_RETURN_IF_ERROR(Annotate(
        driver->Check(driver->EventCreate(&d.reached, CU_EVENT_DISABLE_TIMING), "cuEventCreate"),
        name));
    STASH_RETURN_IF_ERROR(
        Annotate(d.mailbox.Allocate(driver, gpu.context->get(), CudaBuffer::Kind::kPinnedMapped,
                                    kStagingOffset + staging, "its mailbox"),
                 name));
    // Zero-filled (nothing is the group's, no counter counts; the driver promises no zeroed
    // memory), then the header, from pinned memory: cuMemcpyHtoD returns once it landed.
    STASH_RETURN_IF_ERROR(Annotate(
        driver->Check(driver->MemsetD8Async(d.base, 0, d.bytes, gpu.stream), "cuMemsetD8Async"),
        name));
    STASH_RETURN_IF_ERROR(Annotate(d.Reach(), name));
    std::memcpy(d.staging(), &header, sizeof(header));
    STASH_RETURN_IF_ERROR(Annotate(
        driver->Check(driver->MemcpyHtoD(d.base, d.staging(), sizeof(header)), "cuMemcpyHtoD"),
        name));
    d.view.header = At<k::GroupHeader>(d.base, 0);
    d.view.chunk_free = At<uint32_t>(d.base, l.chunk_free_offset);
    d.view.chunk_state = At<uint32_t>(d.base, l.chunk_state_offset);
    d.view.tags = At<uint32_t>(d.base, l.tags_offset);
    d.view.pages = b->pages_;
    d.view.chunks = b->chunks_;
    b->depots_.push_back(std::move(depot));
  }
  return std::unique_ptr<GroupBlock>(std::move(b));
}

k::GroupDepotLaunch CudaGroupBlock::LaunchOn(const Depot& d) const {
  k::GroupDepotLaunch a;
  a.depot = d.view;
  a.chunk_pages = chunk_pages_;
  return a;
}

Status CudaGroupBlock::Run(Depot& d, PagingKernels::GroupOp op,
                           const k::GroupDepotLaunch& args) const {
  const PrimaryContext::Scope scope(*d.gpu.context);
  STASH_RETURN_IF_ERROR(scope.status());
  const k::LaunchResult launched = d.gpu.kernels->Group(op, args, d.gpu.stream);
  if (!launched.ok()) return InternalError(launched.message);
  return d.Reach();
}

int CudaGroupBlock::DepotOf(size_t tier, uint64_t chunk, const char* what) const {
  if (tier >= tier_pool_.size() || chunk >= tier_chunks_[tier]) {
    Log("pool")->warn("group depot: {} of chunk {} of tier {}, which the depot does not have", what,
                      chunk, tier);
    return -1;
  }
  if (tier_pool_[tier] >= 0) return static_cast<int>(tier_pool_[tier]);
  const int d = host_depot_[DepotChunk(tier, chunk)];
  if (d < 0) {
    Log("pool")->warn("group depot: {} of chunk {} of host tier {}, which joined no GPU's depot",
                      what, chunk, tier);
  }
  return d;
}

StatusOr<UniqueFd> CudaGroupBlock::Export(int pool) {
  MutexLock lock(&mu_);
  if (pool < 0 || static_cast<size_t>(pool) >= depots_.size()) {
    return InvalidArgumentError("no group depot for pool " + std::to_string(pool) + " (" +
                                std::to_string(depots_.size()) + " GPUs)");
  }
  const Depot& d = *depots_[pool];
  const PrimaryContext::Scope scope(*d.gpu.context);
  STASH_RETURN_IF_ERROR(Annotate(scope.status(), d.Name()));
  int fd = -1;
  STASH_RETURN_IF_ERROR(
      Annotate(d.gpu.driver->Check(d.gpu.driver->MemExportToShareableHandle(
                                       &fd, d.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                                   "cuMemExportToShareableHandle"),
               "exporting " + d.Name()));
  return UniqueFd(fd);
}

std::string CudaGroupBlock::gpu_uuid(int pool) const {
  if (pool < 0 || static_cast<size_t>(pool) >= depots_.size()) return {};
  return depots_[pool]->gpu.uuid;
}

void CudaGroupBlock::Join(size_t tier, uint64_t chunk, uint64_t pages, int pool) {
  MutexLock lock(&mu_);
  if (tier >= tier_pool_.size() || chunk >= tier_chunks_[tier]) {
    Log("pool")->warn("group depot: join of chunk {} of tier {}, which the depot does not have",
                      chunk, tier);
    return;
  }
  const int64_t target = tier_pool_[tier] >= 0 ? tier_pool_[tier] : pool;
  if (target < 0 || static_cast<size_t>(target) >= depots_.size()) {
    Log("pool")->warn("group depot: chunk {} of tier {} joins for pool {}, which has no depot",
                      chunk, tier, pool);
    return;
  }
  const uint64_t c = DepotChunk(tier, chunk);
  // Remembered first: a join that fails halfway still goes out of the depot it may have touched.
  if (tier_pool_[tier] < 0) host_depot_[c] = static_cast<int>(target);
  Depot& d = *depots_[target];
  k::GroupDepotLaunch a = LaunchOn(d);
  a.chunk = c;
  a.pages = std::min(pages, chunk_pages_);
  const Status st = Run(d, PagingKernels::GroupOp::kJoin, a);
  if (!st.ok()) {
    Log("pool")->warn("{}: chunk {} of tier {} did not join: {}", d.Name(), chunk, tier,
                      st.message());
  }
}

bool CudaGroupBlock::Take(size_t tier, uint64_t chunk, uint64_t pages) {
  MutexLock lock(&mu_);
  const int target = DepotOf(tier, chunk, "take");
  if (target < 0) return false;
  Depot& d = *depots_[target];
  k::GroupDepotLaunch a = LaunchOn(d);
  a.chunk = DepotChunk(tier, chunk);
  a.pages = pages;
  a.d_answer = d.d_answer();
  // Neither answer: a kernel that did not run leaves it.
  constexpr uint64_t kNoAnswer = 0xa5a5a5a5a5a5a5a5ull;
  *d.answer() = kNoAnswer;
  const Status st = Run(d, PagingKernels::GroupOp::kTake, a);
  const uint64_t answer = __atomic_load_n(d.answer(), __ATOMIC_ACQUIRE);
  if (!st.ok() || answer > 1) {
    Log("pool")->warn("{}: taking chunk {} of tier {} back: {}; it stays the group's", d.Name(),
                      chunk, tier,
                      st.ok() ? std::string("the kernel gave no answer") : st.message());
    return false;
  }
  return answer == 1;
}

void CudaGroupBlock::Out(size_t tier, uint64_t chunk) {
  MutexLock lock(&mu_);
  const int target = DepotOf(tier, chunk, "out");
  if (target < 0) return;
  Depot& d = *depots_[target];
  k::GroupDepotLaunch a = LaunchOn(d);
  a.chunk = DepotChunk(tier, chunk);
  const Status st = Run(d, PagingKernels::GroupOp::kOut, a);
  if (tier_pool_[tier] < 0) host_depot_[a.chunk] = -1;
  if (!st.ok()) {
    Log("pool")->warn("{}: chunk {} of tier {} leaving the group: {}", d.Name(), chunk, tier,
                      st.message());
  }
}

uint64_t CudaGroupBlock::Reclaim(const std::vector<uint32_t>& live) {
  MutexLock lock(&mu_);
  std::vector<uint32_t> sorted(live);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  // Launched on every GPU first, then waited for: the GPUs scan their depots at once.
  std::vector<bool> launched(depots_.size(), false);
  for (size_t i = 0; i < depots_.size(); ++i) {
    Depot& d = *depots_[i];
    const PrimaryContext::Scope scope(*d.gpu.context);
    Status st = scope.status();
    if (st.ok() && d.live_capacity < std::max<size_t>(1, sorted.size())) {
      auto grown = std::make_unique<CudaBuffer>();
      const uint64_t capacity =
          std::max({uint64_t{64}, uint64_t{sorted.size()}, 2 * d.live_capacity});
      st = grown->Allocate(d.gpu.driver, d.gpu.context->get(), CudaBuffer::Kind::kPinnedMapped,
                           capacity * sizeof(uint32_t), "the live tags");
      if (st.ok()) {
        d.live = std::move(grown);
        d.live_capacity = capacity;
      }
    }
    if (st.ok()) {
      if (!sorted.empty()) {
        std::memcpy(d.live->host<uint32_t>(), sorted.data(), sorted.size() * sizeof(uint32_t));
      }
      *d.answer() = 0;
      k::GroupDepotLaunch a = LaunchOn(d);
      a.d_live = d.live->device<uint32_t>();
      a.live = sorted.size();
      a.d_answer = d.d_answer();
      const k::LaunchResult result =
          d.gpu.kernels->Group(PagingKernels::GroupOp::kReclaim, a, d.gpu.stream);
      st = result.ok() ? d.gpu.driver->Check(d.gpu.driver->EventRecord(d.reached, d.gpu.stream),
                                             "cuEventRecord")
                       : InternalError(result.message);
    }
    launched[i] = st.ok();
    if (!st.ok()) Log("pool")->warn("{}: reclaiming pages: {}", d.Name(), st.message());
  }
  uint64_t freed = 0;
  for (size_t i = 0; i < depots_.size(); ++i) {
    if (!launched[i]) continue;
    Depot& d = *depots_[i];
    const PrimaryContext::Scope scope(*d.gpu.context);
    Status st = scope.status();
    if (st.ok()) {
      st = d.gpu.driver->Check(d.gpu.driver->EventSynchronize(d.reached), "cuEventSynchronize");
    }
    if (!st.ok()) {
      Log("pool")->warn("{}: waiting for a reclaim: {}", d.Name(), st.message());
      continue;
    }
    freed = SaturatingAdd(freed, __atomic_load_n(d.answer(), __ATOMIC_ACQUIRE));
  }
  return freed;
}

void CudaGroupBlock::ForEachOwned(size_t tier, uint64_t chunk,
                                  const std::function<void(uint32_t)>& owned) const {
  std::vector<uint32_t> tags;
  {
    MutexLock lock(&mu_);
    const int target = DepotOf(tier, chunk, "reading the owners");
    if (target < 0) return;
    Depot& d = *depots_[target];
    const uint64_t first = DepotChunk(tier, chunk) * chunk_pages_;
    const uint64_t n = std::min(chunk_pages_, pages_ - first);
    const PrimaryContext::Scope scope(*d.gpu.context);
    Status st = scope.status();
    if (st.ok()) {
      st = d.gpu.driver->Check(d.gpu.driver->MemcpyDtoHAsync(
                                   d.staging(), reinterpret_cast<CUdeviceptr>(d.view.tags + first),
                                   n * sizeof(uint32_t), d.gpu.stream),
                               "cuMemcpyDtoHAsync(group tags)");
    }
    if (st.ok()) st = d.Reach();
    if (!st.ok()) {
      Log("pool")->warn("{}: reading chunk {} of tier {}: {}", d.Name(), chunk, tier, st.message());
      return;
    }
    const auto* read = reinterpret_cast<const uint32_t*>(d.staging());
    tags.assign(read, read + n);
  }
  for (uint32_t tag : tags) {
    if (tag >= k::kFirstMemberTag) owned(tag);
  }
}

GroupBlock::Counters CudaGroupBlock::Read(uint64_t max, int pool) const {
  MutexLock lock(&mu_);
  Counters sum;
  if (pool != -1 && (pool < 0 || static_cast<size_t>(pool) >= depots_.size())) {
    Log("pool")->warn("group depot: counters of pool {}, which has no depot", pool);
    return sum;
  }
  for (size_t i = 0; i < depots_.size(); ++i) {
    if (pool != -1 && static_cast<size_t>(pool) != i) continue;
    Depot& d = *depots_[i];
    const PrimaryContext::Scope scope(*d.gpu.context);
    Status st = scope.status();
    if (st.ok()) {
      st = d.gpu.driver->Check(
          d.gpu.driver->MemcpyDtoHAsync(d.counters(),
                                        reinterpret_cast<CUdeviceptr>(&d.view.header->claimed),
                                        kCounterWords * sizeof(uint64_t), d.gpu.stream),
          "cuMemcpyDtoHAsync(group counters)");
    }
    if (st.ok()) st = d.Reach();
    if (!st.ok()) {
      Log("pool")->warn("{}: reading its counters: {}", d.Name(), st.message());
      continue;
    }
    uint64_t v[kCounterWords];
    std::memcpy(v, d.counters(), sizeof(v));
    sum.claimed = SaturatingAdd(sum.claimed, std::min(v[0], max));
    sum.high_water = SaturatingAdd(sum.high_water, std::min(v[1], max));
    sum.dry = SaturatingAdd(sum.dry, v[2]);
    sum.dry_pages = SaturatingAdd(sum.dry_pages, std::min(v[3], max));
  }
  sum.claimed = std::min(sum.claimed, max);
  sum.high_water = std::min(sum.high_water, max);
  sum.dry_pages = std::min(sum.dry_pages, max);
  return sum;
}

void CudaGroupBlock::ResetHighWater() {
  MutexLock lock(&mu_);
  for (const auto& depot : depots_) {
    const Status st = Run(*depot, PagingKernels::GroupOp::kResetHighWater, LaunchOn(*depot));
    if (!st.ok()) {
      Log("pool")->warn("{}: starting a new high-water window: {}", depot->Name(), st.message());
    }
  }
}

StatusOr<GroupBlock::Factory> CudaGroupBlockFactory(
    const std::vector<std::unique_ptr<CopyExecutor>>& executors) {
  if (executors.empty()) return FailedPreconditionError("group depots need at least one GPU");
  std::vector<CudaGpu> gpus;
  for (const auto& executor : executors) {
    std::optional<CudaGpu> gpu = executor != nullptr ? CudaGpuOf(*executor) : std::nullopt;
    if (!gpu.has_value()) {
      return InvalidArgumentError("group depots on GPUs need the cuda backend's executors");
    }
    gpus.push_back(std::move(*gpu));
  }
  return GroupBlock::Factory(
      [gpus = std::move(gpus)](uint64_t page_bytes, uint64_t chunk_pages,
                               const std::vector<GroupBlock::TierShape>& tiers) {
        return CudaGroupBlock::Create(gpus, page_bytes, chunk_pages, tiers);
      });
}

}  // namespace stash::daemon

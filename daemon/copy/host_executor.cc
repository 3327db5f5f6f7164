#include "daemon/copy/host_executor.h"

#include <algorithm>
#include <cstring>

#include "common/host_event.h"
#include "common/shm.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

// Copies of fewer bytes than this run on the pool worker alone.
constexpr uint64_t kSplitBytes = 4ULL << 20;

class ShmMemory final : public MappedMemory {
 public:
  explicit ShmMemory(std::unique_ptr<SharedMemory> shm)
      : MappedMemory(shm->data(), shm->data(), shm->size()), shm_(std::move(shm)) {}

 private:
  std::unique_ptr<SharedMemory> shm_;
};

}  // namespace

void HostExecutor::Raise(const DoneSignal& done) {
  if (done.memory == nullptr) return;
  EventSignal(reinterpret_cast<uint64_t*>(done.memory->host() + done.offset), done.value);
}

StatusOr<std::unique_ptr<MappedMemory>> HostExecutor::Open(const v1::RegisterMemory& reg,
                                                           UniqueFd fd) {
  if (reg.kind() != v1::MEMORY_KIND_HOST_FD) {
    return FailedPreconditionError("the host backend opens only MEMORY_KIND_HOST_FD memory");
  }
  auto shm = SharedMemory::MapClientFd(std::move(fd), reg.bytes());
  if (!shm.ok()) return shm.status();
  return std::unique_ptr<MappedMemory>(std::make_unique<ShmMemory>(std::move(shm).value()));
}

void HostExecutor::Stash(const StashWork& work, Then then) {
  StashRecord& record = *work.record;
  int64_t count = work.count.value;
  // The count is read only now, after the ready event: the sync-free case.
  if (work.count.data != nullptr) std::memcpy(&count, work.count.data, sizeof(count));

  Tier* host = work.allow_host_spill ? host_ : nullptr;
  // Lock order: the pool's own tier, then the shared host tier.
  device_->mu().Lock();
  if (host != nullptr) host->mu().Lock();
  const kernels::StashPlan plan = kernels::PlanStash(
      count, work.count.divisor, record.max_rows, record.row_bytes, device_->page_bytes(),
      device_->ring(), host != nullptr ? &host->ring() : nullptr);
  Tier* chosen = nullptr;
  if (plan.placement == kernels::Placement::kDevice) {
    chosen = device_;
    if (host != nullptr) host->mu().Unlock();
  } else if (plan.placement == kernels::Placement::kHost) {
    chosen = host;
    device_->mu().Unlock();
  } else {
    if (host != nullptr) host->mu().Unlock();
    device_->mu().Unlock();
  }
  record.plan = plan;
  record.tier = chosen;
  if (chosen != nullptr) {
    record.page_record.resize(plan.pages);
    const kernels::PagedSpan span{chosen->base(), chosen->page_bytes(), record.page_record.data(),
                                  plan.bytes};
    const kernels::PageRing& ring = chosen->ring();
    const uint8_t* source = work.source;
    const uint64_t min_slots = std::max<uint64_t>(1, kSplitBytes / chosen->page_bytes());
    workers_->ParallelFor(plan.pages, min_slots, [&](uint64_t first, uint64_t end) {
      kernels::StashPages(source, ring, plan.head, span, first, end);
    });
    // Every worker has read the old head: publish the new one.
    chosen->PublishAlloc(plan.pages, plan.bytes);
    chosen->mu().Unlock();
  }
  Raise(work.done);
  then();
}

void HostExecutor::Reload(const ReloadWork& work, Then then) {
  StashRecord& record = *work.record;
  Tier* tier = record.tier;
  if (tier != nullptr) {
    MutexLock lock(&tier->mu());
    if (work.destination != nullptr) {
      const kernels::PagedSpan span{tier->base(), tier->page_bytes(), record.page_record.data(),
                                    record.plan.bytes};
      uint8_t* destination = work.destination;
      const uint64_t min_slots = std::max<uint64_t>(1, kSplitBytes / tier->page_bytes());
      workers_->ParallelFor(
          record.page_record.size(), min_slots,
          [&](uint64_t first, uint64_t end) { kernels::PopPages(destination, span, first, end); });
      if (work.zero_tail) {
        kernels::ZeroBytes(destination, record.plan.bytes, record.max_rows * record.row_bytes);
      }
    }
    kernels::ReturnPages(tier->ring(), tier->ring().tail, record.page_record.data(), 0,
                         record.page_record.size());
    tier->PublishFree(record.page_record.size(), record.plan.bytes);
  }
  Raise(work.done);
  then();
}

}  // namespace stash::daemon

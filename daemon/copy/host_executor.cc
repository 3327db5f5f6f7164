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

// The pages a stash of `count` (a valid count: >= 0, rows <= max_rows) takes in `tier`.
uint64_t PlannedPages(int64_t count, uint32_t divisor, const StashRecord& record,
                      const Tier* tier) {
  const uint64_t d = divisor == 0 ? 1 : divisor;
  const uint64_t rows = (static_cast<uint64_t>(count) + d - 1) / d;
  return kernels::PagesFor(rows * record.row_bytes, tier->page_bytes());
}

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

  // Own pool, then the peer pools (most free pages first, each beyond its own reserve), then the
  // host tier (when the session allows spill), else overflow; a stash goes whole into one tier.
  // One tier's lock at a time: pools lend to each other, so a worker holding its own tier while
  // it waits for a peer's could deadlock with that peer's worker doing the same. The chosen
  // tier's lock is held from planning to publishing (the copy reads its ring at the head snapshot).
  const auto plan_in = [&](Tier* tier, kernels::Placement placement, bool lend) {
    tier->mu().Lock();
    kernels::StashPlan in{};
    if (!lend || tier->Lends(PlannedPages(count, work.count.divisor, record, tier))) {
      const kernels::TierChoice choice{&tier->ring(), placement};
      in = kernels::PlanStashInOrder(count, work.count.divisor, record.max_rows, record.row_bytes,
                                     tier->page_bytes(), &choice, 1);
    } else {
      in = kernels::PlanStashInOrder(count, work.count.divisor, record.max_rows, record.row_bytes,
                                     tier->page_bytes(), nullptr, 0);
    }
    if (in.placement != placement) tier->mu().Unlock();
    return in;
  };
  Tier* chosen = device_;
  kernels::StashPlan plan = plan_in(device_, kernels::Placement::kDevice, false);
  // Overflow with rows <= max_rows: the own pool is full; anything else is decided.
  const bool full = plan.placement == kernels::Placement::kOverflow && plan.rows <= record.max_rows;
  if (full && !peers_.empty()) {
    std::vector<Tier*> peers = peers_;
    std::stable_sort(peers.begin(), peers.end(), [](const Tier* a, const Tier* b) {
      return a->pages_free_estimate() > b->pages_free_estimate();
    });
    for (Tier* peer : peers) {
      plan = plan_in(peer, kernels::Placement::kPeer, true);
      if (plan.placement == kernels::Placement::kPeer) {
        chosen = peer;
        break;
      }
    }
  }
  if (full && plan.placement == kernels::Placement::kOverflow && work.allow_host_spill &&
      host_ != nullptr) {
    plan = plan_in(host_, kernels::Placement::kHost, false);
    chosen = host_;
  }
  const bool placed = plan.placement == kernels::Placement::kDevice ||
                      plan.placement == kernels::Placement::kPeer ||
                      plan.placement == kernels::Placement::kHost;
  if (!placed) chosen = nullptr;
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
    chosen->PublishAlloc(plan.pages, plan.bytes, plan.placement == kernels::Placement::kPeer);
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
    tier->PublishFree(record.page_record.size(), record.plan.bytes,
                      record.plan.placement == kernels::Placement::kPeer);
  }
  Raise(work.done);
  then();
}

}  // namespace stash::daemon

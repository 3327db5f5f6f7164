#include "daemon/tier.h"

#include <numeric>

namespace stash::daemon {

StatusOr<std::unique_ptr<Tier>> Tier::Create(std::string name, int pool, uint64_t page_bytes,
                                             uint64_t pages) {
  if (pages == 0) return InvalidArgumentError("tier " + name + " has no pages");
  auto memory = SharedMemory::CreateAnonymous("stashd-" + name, pages * page_bytes);
  if (!memory.ok()) {
    return ResourceExhaustedError("cannot allocate tier " + name + " (" +
                                  std::to_string(pages * page_bytes) +
                                  " bytes): " + memory.status().message());
  }
  return std::unique_ptr<Tier>(
      new Tier(std::move(name), pool, page_bytes, pages, std::move(memory).value()));
}

std::unique_ptr<Tier> Tier::CreateAccounting(std::string name, int pool, uint64_t page_bytes,
                                             uint64_t pages) {
  return std::unique_ptr<Tier>(new Tier(std::move(name), pool, page_bytes, pages, nullptr));
}

Tier::Tier(std::string name, int pool, uint64_t page_bytes, uint64_t pages,
           std::unique_ptr<SharedMemory> memory)
    : name_(std::move(name)),
      pool_(pool),
      page_bytes_(page_bytes),
      pages_(pages),
      memory_(std::move(memory)),
      ids_(memory_ != nullptr ? pages : 0) {
  std::iota(ids_.begin(), ids_.end(), uint64_t{0});
  ring_ = kernels::PageRing{ids_.data(), ids_.size(), 0, ids_.size()};
}

void Tier::PublishAlloc(uint64_t pages, uint64_t bytes) {
  ring_.head += pages;
  AccountAlloc(pages, bytes);
}

void Tier::PublishFree(uint64_t pages, uint64_t bytes) {
  ring_.tail += pages;
  AccountFree(pages, bytes);
}

void Tier::AccountAlloc(uint64_t pages, uint64_t bytes) {
  const uint64_t used = pages_used_.fetch_add(pages, std::memory_order_relaxed) + pages;
  uint64_t high = pages_high_water_.load(std::memory_order_relaxed);
  while (used > high &&
         !pages_high_water_.compare_exchange_weak(high, used, std::memory_order_relaxed)) {
  }
  bytes_stashed_.fetch_add(bytes, std::memory_order_relaxed);
  stashes_live_.fetch_add(1, std::memory_order_relaxed);
}

void Tier::AccountFree(uint64_t pages, uint64_t bytes) {
  pages_used_.fetch_sub(pages, std::memory_order_relaxed);
  bytes_stashed_.fetch_sub(bytes, std::memory_order_relaxed);
  stashes_live_.fetch_sub(1, std::memory_order_relaxed);
}

bool Tier::RingIsPermutation() {
  MutexLock lock(&mu_);
  std::vector<bool> seen(pages_, false);
  for (uint64_t slot = ring_.head; slot < ring_.tail; ++slot) {
    const uint64_t id = kernels::RingPageAt(ring_, 0, slot);
    if (id >= pages_ || seen[id]) return false;
    seen[id] = true;
  }
  return ring_.tail - ring_.head == pages_;
}

TierSnapshot Tier::Snapshot() const {
  TierSnapshot s;
  s.name = name_;
  s.pool = pool_;
  s.page_bytes = page_bytes_;
  s.pages_total = pages_;
  s.pages_used = pages_used_.load(std::memory_order_relaxed);
  s.pages_high_water = pages_high_water_.load(std::memory_order_relaxed);
  s.bytes_stashed = bytes_stashed_.load(std::memory_order_relaxed);
  s.stashes_live = stashes_live_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace stash::daemon

#include "daemon/tiers/tier.h"

#include "daemon/tiers/host_chunk_lender.h"

#include <algorithm>
#include <numeric>

#include <fcntl.h>

#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {

StatusOr<std::unique_ptr<Tier>> Tier::Create(std::string name, int pool, uint64_t page_bytes,
                                             uint64_t pages, uint64_t chunk_pages,
                                             const ChunkMemoryOptions& options) {
  if (pages == 0) return InvalidArgumentError("tier " + name + " has no pages");
  if (chunk_pages == 0 || chunk_pages > pages) chunk_pages = pages;
  auto memory =
      ChunkMemory::Create("stashd-" + name, pages * page_bytes, chunk_pages * page_bytes, options);
  if (!memory.ok()) {
    return ResourceExhaustedError("cannot allocate tier " + name + " (" +
                                  std::to_string(pages * page_bytes) +
                                  " bytes): " + memory.status().message());
  }
  return std::unique_ptr<Tier>(
      new Tier(std::move(name), pool, page_bytes, pages, chunk_pages, std::move(memory).value()));
}

std::unique_ptr<Tier> Tier::CreateAccounting(std::string name, int pool, uint64_t page_bytes,
                                             uint64_t pages, uint64_t chunk_pages,
                                             const ChunkMemory* reported) {
  std::unique_ptr<Tier> tier(
      new Tier(std::move(name), pool, page_bytes, pages, chunk_pages, nullptr));
  tier->reported_ = reported;
  return tier;
}

Tier::~Tier() = default;

Tier::Tier(std::string name, int pool, uint64_t page_bytes, uint64_t pages, uint64_t chunk_pages,
           std::unique_ptr<ChunkMemory> memory)
    : name_(std::move(name)),
      pool_(pool),
      page_bytes_(page_bytes),
      pages_(pages),
      chunk_pages_(chunk_pages),
      memory_(std::move(memory)),
      ids_(memory_ != nullptr ? pages : 0) {
  std::iota(ids_.begin(), ids_.end(), uint64_t{0});
  ring_ = kernels::PageRing{ids_.data(), ids_.size(), 0, ids_.size()};
  const uint64_t n = chunks();
  chunk_free_pages_.resize(n);
  chunk_in_ring_.assign(n, true);
  chunk_written_.assign(n, false);
  for (uint64_t c = 0; c < n; ++c) chunk_free_pages_[c] = ChunkPages(c);
  chunks_free_.store(n, std::memory_order_relaxed);
  if (memory_ != nullptr) {
    own_lender_ = std::make_unique<HostChunkLender>(this);
    lender_ = own_lender_.get();
  }
}

uint64_t Tier::ChunkPages(uint64_t chunk) const {
  return std::min(chunk_pages_, pages_ - chunk * chunk_pages_);
}

void Tier::CountChunkPages(uint64_t first, uint64_t n, int delta) {
  if (chunk_pages_ == 0) return;
  for (uint64_t slot = first; slot < first + n; ++slot) {
    const uint64_t id = kernels::RingPageAt(ring_, 0, slot);
    STASH_CHECK(id < pages_) << "tier " << name_ << ": page id " << id << " in its ring";
    const uint64_t c = id / chunk_pages_;
    const uint64_t full = ChunkPages(c);
    if (delta < 0) {
      if (chunk_in_ring_[c] && chunk_free_pages_[c] == full) {
        chunks_free_.fetch_sub(1, std::memory_order_relaxed);
      }
      --chunk_free_pages_[c];
      chunk_written_[c] = true;
    } else {
      ++chunk_free_pages_[c];
      if (chunk_in_ring_[c] && chunk_free_pages_[c] == full) {
        chunks_free_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

void Tier::PublishAlloc(uint64_t pages, uint64_t bytes, bool lent) {
  CountChunkPages(ring_.head, pages, -1);
  ring_.head += pages;
  AddUsed(pages, lent);
  bytes_stashed_.fetch_add(bytes, std::memory_order_relaxed);
  stashes_live_.fetch_add(1, std::memory_order_relaxed);
}

void Tier::PublishFree(uint64_t pages, uint64_t bytes, bool lent) {
  CountChunkPages(ring_.tail, pages, +1);
  ring_.tail += pages;
  AccountFree(pages, bytes);
  if (lent) pages_lent_.fetch_sub(pages, std::memory_order_relaxed);
}

uint64_t Tier::PeerReserve() const { return PeerReservePages(pages_); }

std::vector<uint64_t> Tier::WhollyFreeChunks() {
  std::vector<uint64_t> out;
  for (uint64_t c = 0; c < chunk_in_ring_.size(); ++c) {
    if (chunk_in_ring_[c] && chunk_free_pages_[c] == ChunkPages(c)) out.push_back(c);
  }
  return out;
}

void Tier::TakeChunks(const std::vector<uint64_t>& chunks, std::vector<bool>* written) {
  if (chunks.empty()) return;
  std::vector<bool> take(chunk_in_ring_.size(), false);
  uint64_t pages = 0;
  if (written != nullptr) written->clear();
  for (uint64_t c : chunks) {
    STASH_CHECK(c < take.size() && !take[c] && chunk_in_ring_[c] &&
                chunk_free_pages_[c] == ChunkPages(c))
        << "tier " << name_ << ": chunk " << c << " is not wholly free";
    take[c] = true;
    pages += ChunkPages(c);
    if (written != nullptr) written->push_back(chunk_written_[c]);
  }
  // Compaction: the write slot never passes the read slot, so one pass in place suffices.
  uint64_t write = ring_.head;
  for (uint64_t read = ring_.head; read < ring_.tail; ++read) {
    const uint64_t id = kernels::RingPageAt(ring_, 0, read);
    if (take[id / chunk_pages_]) continue;
    ids_[write % ring_.capacity] = id;
    ++write;
  }
  STASH_CHECK(ring_.tail - write == pages) << "tier " << name_ << ": ring compaction lost pages";
  ring_.tail = write;
  for (uint64_t c : chunks) {
    chunk_in_ring_[c] = false;
    chunk_free_pages_[c] = 0;
  }
  chunks_free_.fetch_sub(chunks.size(), std::memory_order_relaxed);
  AddUsed(pages);
}

void Tier::ReturnChunk(uint64_t chunk) {
  STASH_CHECK(chunk < chunk_in_ring_.size() && !chunk_in_ring_[chunk])
      << "tier " << name_ << ": chunk " << chunk << " returned but not taken";
  const uint64_t pages = ChunkPages(chunk);
  for (uint64_t p = 0; p < pages; ++p) {
    ids_[(ring_.tail + p) % ring_.capacity] = chunk * chunk_pages_ + p;
  }
  ring_.tail += pages;
  chunk_in_ring_[chunk] = true;
  chunk_free_pages_[chunk] = pages;
  chunk_written_[chunk] = false;
  chunks_free_.fetch_add(1, std::memory_order_relaxed);
  pages_used_.fetch_sub(pages, std::memory_order_relaxed);
}

namespace {
void RaiseTo(std::atomic<uint64_t>& high_water, uint64_t value) {
  uint64_t high = high_water.load(std::memory_order_relaxed);
  while (value > high &&
         !high_water.compare_exchange_weak(high, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void Tier::AddUsed(uint64_t pages, bool lent) {
  if (lent) pages_lent_.fetch_add(pages, std::memory_order_relaxed);
  const uint64_t used = pages_used_.fetch_add(pages, std::memory_order_relaxed) + pages;
  RaiseTo(pages_high_water_, used);
}

void Tier::AccountAlloc(uint64_t pages, uint64_t bytes) {
  AddUsed(pages);
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
  uint64_t count = 0;
  auto see = [&](uint64_t id) {
    if (id >= pages_ || seen[id]) return false;
    seen[id] = true;
    ++count;
    return true;
  };
  for (uint64_t slot = ring_.head; slot < ring_.tail; ++slot) {
    if (!see(kernels::RingPageAt(ring_, 0, slot))) return false;
  }
  for (uint64_t c = 0; c < chunk_in_ring_.size(); ++c) {
    if (chunk_in_ring_[c]) continue;
    for (uint64_t p = 0; p < ChunkPages(c); ++p) {
      if (!see(c * chunk_pages_ + p)) return false;
    }
  }
  return count == pages_;
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
  s.pages_lent = pages_lent_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace stash::daemon

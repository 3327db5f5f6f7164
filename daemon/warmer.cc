#include "daemon/warmer.h"

#include <chrono>
#include <utility>

#include "common/bytes.h"
#include "common/logging.h"

namespace stash::daemon {
namespace {

const char* MethodName(PopulateMethod method) {
  return method == PopulateMethod::kPopulateWrite ? "MADV_POPULATE_WRITE"
                                                  : "a read of each page (no MADV_POPULATE_WRITE)";
}

}  // namespace

Warmer::Warmer(std::vector<Region> regions) : regions_(std::move(regions)) {
  {
    MutexLock lock(&mu_);
    for (const Region& r : regions_) {
      for (uint64_t c = 0; c < r.memory->chunks(); ++c) start_.push_back(Job{r.memory, c});
    }
    started_warm_ = start_.empty();
  }
  thread_ = std::thread([this] { Run(); });
}

Warmer::~Warmer() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

bool Warmer::started_warm() const {
  MutexLock lock(&mu_);
  return started_warm_;
}

void Warmer::Drain() {
  MutexLock lock(&mu_);
  while (!stop_ && (busy_ || !start_.empty())) cv_.Wait(&mu_);
}

void Warmer::Populate(const Job& job) {
  auto populated = job.memory->Populate(job.chunk);
  MutexLock lock(&mu_);
  if (populated.ok()) {
    if (!method_logged_) {
      method_logged_ = true;
      Log("pool")->info("warming the pools: populating their memory with {}",
                        MethodName(*populated));
    }
    return;
  }
  if (failure_logged_) return;
  failure_logged_ = true;
  Log("pool")->warn(
      "cannot populate pool memory ahead of use ({}); stashes into it fault their pages in as "
      "they copy, which is slower: free memory on the node or lower --pool-bytes / "
      "--host-tier-bytes (said once)",
      populated.status().message());
}

void Warmer::Run() {
  const auto start = std::chrono::steady_clock::now();
  // Progress of the start-up pass: the region now and the tenths of it said.
  const ChunkMemory* region = nullptr;
  uint64_t said = 0;
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      busy_ = false;
      cv_.SignalAll();  // Drain
      while (!stop_ && start_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      job = start_.front();
      start_.pop_front();
      busy_ = true;
    }
    if (job.memory->bytes_warm() < job.memory->bytes()) Populate(job);
    const Region* r = nullptr;
    for (const Region& candidate : regions_) {
      if (candidate.memory == job.memory) r = &candidate;
    }
    if (region != job.memory) {
      region = job.memory;
      said = 0;
    }
    const ChunkMemory& m = *job.memory;
    const uint64_t tenths = (job.chunk + 1) * 10 / m.chunks();
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
    if (m.bytes() >= (1ULL << 30) && tenths > said) {
      said = tenths;
      Log("pool")->info("{}: {} of {} warm ({:.1f} s)", r->name, FormatBytes(m.bytes_warm()),
                        FormatBytes(m.bytes()), seconds.count());
    }
    MutexLock lock(&mu_);
    if (start_.empty() && !started_warm_) {
      started_warm_ = true;
      Log("pool")->info("every pool is warm ({:.1f} s after start)", seconds.count());
    }
  }
}

}  // namespace stash::daemon

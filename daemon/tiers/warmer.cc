#include "daemon/tiers/warmer.h"

#include <chrono>
#include <utility>

#include "common/bytes.h"
#include "common/logging.h"

namespace stash::daemon {
namespace {

const char* MethodName(PopulateMethod method) {
  return method == PopulateMethod::kPopulateWrite ? "MADV_POPULATE_WRITE"
                                                  : "a write of each page (no MADV_POPULATE_WRITE)";
}

}  // namespace

Warmer::Warmer(std::vector<Region> regions, std::function<void(double seconds)> done)
    : regions_(std::move(regions)), done_(std::move(done)), thread_([this] { Run(); }) {}

Warmer::~Warmer() {
  stop_ = true;
  Wait();
}

void Warmer::Wait() {
  if (thread_.joinable()) thread_.join();
}

void Warmer::Run() {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  bool method_said = false;
  bool failure_said = false;  // once per daemon: memory is short
  for (const Region& r : regions_) {
    ChunkMemory& m = *r.memory;
    uint64_t said = 0;  // tenths of the region said so far
    for (uint64_t c = 0; c < m.chunks() && m.bytes_warm() < m.bytes(); ++c) {
      if (stop_) return;
      auto populated = m.Populate(c);
      if (populated.ok() && !method_said) {
        method_said = true;
        Log("pool")->info("warming the pools: populating their memory with {}",
                          MethodName(*populated));
      } else if (!populated.ok() && !failure_said) {
        failure_said = true;
        Log("pool")->warn(
            "cannot populate pool memory ahead of use ({}); stashes into it fault their pages in "
            "as they copy, which is slower: free memory on the node or lower --pool-bytes / "
            "--host-tier-bytes (said once)",
            populated.status().message());
      }
      const uint64_t tenths = (c + 1) * 10 / m.chunks();
      if (m.bytes() >= (1ULL << 30) && tenths > said) {
        said = tenths;
        Log("pool")->info("{}: {} of {} warm ({:.1f} s)", r.name, FormatBytes(m.bytes_warm()),
                          FormatBytes(m.bytes()), seconds());
      }
    }
  }
  Log("pool")->info("every pool is warm ({:.1f} s after start)", seconds());
  if (done_) done_(seconds());
}

}  // namespace stash::daemon

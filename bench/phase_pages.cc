#include "bench/phase_pages.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "common/macros.h"
#include "common/shm.h"

namespace stash::bench {
namespace {

constexpr uint64_t kBytes = 256 * kMiB;
constexpr uint64_t kChunk = 16 * kMiB;  // whole 2 MiB pages

// HugePages_Free less HugePages_Rsvd, when the default huge page is 2 MiB; else 0.
uint64_t FreeHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0, free = 0, rsvd = 0, size_kib = 0;
  std::string rest;
  while (in >> key >> value) {
    std::getline(in, rest);
    if (key == "HugePages_Free:") free = value;
    if (key == "HugePages_Rsvd:") rsvd = value;
    if (key == "Hugepagesize:") size_kib = value;
  }
  return size_kib == 2048 && free > rsvd ? free - rsvd : 0;
}

// One daemon with `pages` (--huge-pages) and one copy worker: its fields.
StatusOr<Fields> Measure(Env& env, bool mapped, const std::string& pages) {
  const uint64_t lease = 2 * kBytes;
  // Mapped: chunks beyond the lease for the sixteenth each tier keeps for another user's first
  // session (at least one: docs/security.md).
  uint64_t chunks = lease / kChunk;
  while (mapped && chunks - std::max<uint64_t>(1, chunks / 16) < lease / kChunk) ++chunks;
  std::vector<std::string> daemon_flags = {
      "--pool-bytes=" + std::to_string(chunks * kChunk), "--host-tier-bytes=0",
      "--chunk-bytes=" + std::to_string(kChunk), "--huge-pages=" + pages};
  std::vector<std::string> worker_flags = {"--task=copy", "", "--bytes=" + std::to_string(kBytes),
                                           "--reps=7", "--memcpy-threads=2"};
  if (mapped) {
    daemon_flags.push_back("--max-lease-bytes=" + std::to_string(lease));
    worker_flags.insert(
        worker_flags.end(),
        {"--mode=mapped", "--lease-bytes=" + std::to_string(lease), "--copy-threads=2"});
  } else {
    daemon_flags.emplace_back("--copy-threads=2");
  }
  STASH_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(env, daemon_flags));
  worker_flags[1] = "--socket=" + daemon->socket();
  return RunWorker(env, worker_flags);
}

}  // namespace

Status PhasePages(Env& env, std::vector<Row>& rows) {
  const std::string shmem = ShmemHugePageSetting();
  const bool thp = ShmemHugePagesOffered(shmem);
  const uint64_t needed = (2 * kBytes + 3 * kChunk) / (2 * kMiB);
  const bool hugetlb = FreeHugePages() >= needed;
  Status first;
  for (const std::string& mode : env.options.modes) {
    const bool mapped = mode == "mapped";
    const std::string tag = "256 MiB, " + mode + ", 2 copy threads";
    Progress("pages " + tag + ", 4 KiB pages");
    auto small = Measure(env, mapped, "off");
    if (!small.ok()) {
      rows.push_back({"1", "pages " + tag + ": did not run (stderr says why)", "", "", "", "",
                      Verdict::kMissed});
      if (first.ok()) first = small.status();
      continue;
    }
    Fields& base = *small;
    const std::string baseline = "4 KiB pages " + Fixed(base["stash_median_gbps"], 2) + " / " +
                                 Fixed(base["reload_median_gbps"], 2) + " GB/s";
    std::vector<std::pair<std::string, std::string>> kinds;  // --huge-pages value, its name
    if (thp) kinds.emplace_back("auto", "transparent huge pages");
    if (hugetlb) kinds.emplace_back("hugetlb", "hugetlb 2 MiB pages");
    for (const auto& [flag, name] : kinds) {
      Progress("pages " + tag + ", " + name);
      auto huge = Measure(env, mapped, flag);
      if (!huge.ok()) {
        rows.push_back({"1", "pages " + tag + ", " + name + ": did not run (stderr says why)", "",
                        "", "", "", Verdict::kMissed});
        if (first.ok()) first = huge.status();
        continue;
      }
      Fields& f = *huge;
      rows.push_back(
          {"1", "  steady stash / reload " + tag + ", " + name + " / 4 KiB pages",
           Fixed(f["stash_median_gbps"], 2) + " / " + Fixed(f["reload_median_gbps"], 2) + " GB/s",
           baseline,
           Ratio(f["stash_median_gbps"] / base["stash_median_gbps"]) + " / " +
               Ratio(f["reload_median_gbps"] / base["reload_median_gbps"]),
           "", Verdict::kNoTarget});
    }
    if (!thp) {
      rows.push_back({"1", "  transparent huge pages, " + tag,
                      "not offered here (shmem_enabled=" + (shmem.empty() ? "?" : shmem) + ")", "",
                      "", "", Verdict::kNoTarget});
    }
    if (!hugetlb) {
      rows.push_back({"1", "  hugetlb pages, " + tag,
                      "not measured: fewer than " + std::to_string(needed) +
                          " free 2 MiB huge pages (vm.nr_hugepages)",
                      "", "", "", Verdict::kNoTarget});
    }
  }
  return first;
}

}  // namespace stash::bench

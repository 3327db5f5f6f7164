// stashd's knobs: one table (name, env var, default, unit, help), read from flags, then
// STASHD_<NAME>, then the default. Flags win.
#ifndef STASH_DAEMON_CONFIG_H_
#define STASH_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "stash/status.h"

namespace stash::daemon {

enum class BackendChoice { kAuto, kHost, kCuda };

// --huge-pages: auto = shmem transparent huge pages where the kernel offers them; off = base
// pages; hugetlb = pages reserved in the kernel's huge page pool (vm.nr_hugepages).
enum class HugePages { kAuto, kOff, kHugetlb };

const char* BackendChoiceName(BackendChoice choice);

// The effective configuration of one daemon. Every field has its knob in config.cc's table.
struct DaemonConfig {
  std::string socket;  // "" = resolve (flag > $STASHD_SOCKET > default)
  BackendChoice backend = BackendChoice::kAuto;
  uint64_t pool_bytes = 1ULL << 30;       // per GPU (per simulated GPU on the host backend)
  uint64_t page_bytes = 256ULL << 10;     // power of two, 4 KiB .. 1 GiB
  uint64_t host_tier_bytes = 1ULL << 30;  // 0 = no host tier
  uint32_t devices = 1;                   // host backend: simulated GPUs, one pool each
  std::string log_level = "info";
  std::string log_format = "text";  // "text" or "json" (one object per line)
  std::string listen;               // "" = no TCP; else HOST:PORT, stats only
  bool listen_sessions = false;     // the TCP listener also serves per-session rows
  uint32_t copy_threads = 2;        // threads that split one large copy (>= 1)
  uint32_t max_inflight = 4096;     // queued requests per session before
                                    // RESOURCE_EXHAUSTED
  uint32_t drain_timeout_s = 5;     // SIGTERM: seconds to let ranks reload before stopping
  // gRPC connections that carried no call this long are closed; 0 = never.
  uint32_t idle_connection_timeout_s = 300;
  std::string metrics_listen;  // "" = no Prometheus endpoint; else HOST:PORT (port 0 = any)
  // Mapped mode (host backend).
  uint64_t chunk_bytes = 0;      // 0 = --pool-bytes / 32 (>= host tier / 1024), whole pages
  uint64_t max_lease_bytes = 0;  // per session in each tier; 0 = one device pool's bytes
  bool peer_tier = false;        // sessions may lease other pools' spare chunks
  // Daemon-copy: a stash its own pool cannot hold goes to another pool's spare pages (the peer
  // tier, beyond each pool's reserve for its own sessions) before the host tier.
  bool copy_peer_tier = true;
  // Groups: members claim free pages of the group's chunks on other devices (docs/design.md,
  // "Groups").
  bool group_peer_tier = true;
  // Host backend: populate and lock (mlock) every tier at start, so the memory is the daemon's
  // for good; without it the kernel hands pages out as they are first touched.
  bool lock_memory = false;
  // Host backend: populate the tiers in the background from the start, and renewed chunks
  // before they are used again (daemon/tiers/warmer.h).
  bool warm_memory = true;
  // Host backend: which pages the tiers ask for (--huge-pages).
  HugePages huge_pages = HugePages::kAuto;

  // One row per knob, for GetConfig and the start-up log: name, value, source, help.
  struct Entry {
    std::string name;
    std::string value;
    std::string source;  // "default", "env" or "flag"
    std::string help;
  };
  std::vector<Entry> entries;
};

// What ParseCommandLine decided.
struct CommandLine {
  enum class Action { kRun, kHelp, kVersion, kPrintConfig };
  Action action = Action::kRun;
  DaemonConfig config;
  // Lines to log as warnings once logging is set up (e.g. a misspelled STASHD_* variable).
  std::vector<std::string> warnings;
};

// Warnings for STASHD_* variables in `env` (NAME=value strings, a null-terminated array) that
// are no stashd knob and no variable of the other stashd tools: one per variable, naming the
// closest knob and listing the known ones.
std::vector<std::string> UnknownEnvWarnings(char** env);

// Parses argv (abseil flags; `--pool-bytes` and `--pool_bytes` both work) and the STASHD_*
// environment. INVALID_ARGUMENT names the knob, the value and what is allowed. Call once per
// process: abseil flags are process-wide.
StatusOr<CommandLine> ParseCommandLine(int argc, char** argv);

// The --help text: every knob with its default, unit and env var.
std::string UsageText();

// Checks the cross-knob rules (page size a power of two and <= pool size, ...) and fills
// `entries`. ParseCommandLine calls it; tests that build a DaemonConfig by hand call it too.
Status ValidateConfig(DaemonConfig& config);

// Pages per chunk: --chunk-bytes, or a device pool / 32 in whole pages: tens of chunks per pool.
// At least one page, and large enough that the host tier, often much larger, stays within 1024
// chunks. (The cuda backend rounds it up to the GPU's allocation granularity.)
uint64_t ChunkPages(const DaemonConfig& config);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CONFIG_H_

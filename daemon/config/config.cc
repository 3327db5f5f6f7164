#include "daemon/config/config.h"

#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/reflection.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "common/bytes.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/text.h"

// The flags themselves. Each holds text; the knob table below parses it, so a flag, its
// environment variable and its default go through one parser and one error message.
ABSL_FLAG(std::string, socket, "", "socket path");
ABSL_FLAG(std::string, backend, "auto", "backend");
ABSL_FLAG(std::string, pool_bytes, "1GiB", "pool bytes per GPU");
ABSL_FLAG(std::string, page_bytes, "256KiB", "page bytes");
ABSL_FLAG(std::string, host_tier_bytes, "1GiB", "host tier bytes");
ABSL_FLAG(std::string, devices, "1", "simulated GPUs");
ABSL_FLAG(std::string, log_level, "info", "log level");
ABSL_FLAG(std::string, log_format, "text", "log format");
ABSL_FLAG(std::string, listen, "", "TCP listen address");
ABSL_FLAG(std::string, listen_sessions, "false", "per-session rows on the TCP listener");
ABSL_FLAG(std::string, copy_threads, "2", "copy threads");
ABSL_FLAG(std::string, max_inflight, "4096", "max in-flight requests per session");
ABSL_FLAG(std::string, metrics_listen, "", "Prometheus /metrics listen address");
ABSL_FLAG(std::string, drain_timeout, "5", "seconds to drain on SIGTERM");
ABSL_FLAG(std::string, idle_connection_timeout, "300", "seconds before an idle connection closes");
ABSL_FLAG(std::string, chunk_bytes, "0", "mapped mode: chunk bytes");
ABSL_FLAG(std::string, max_lease_bytes, "0", "mapped mode: lease quota per session");
ABSL_FLAG(std::string, peer_tier, "false", "mapped mode: lend other pools' spare chunks");
ABSL_FLAG(std::string, copy_peer_tier, "true", "daemon-copy: stash in other pools' spare pages");
ABSL_FLAG(std::string, group_peer_tier, "true", "groups: claim other devices' free group pages");
ABSL_FLAG(std::string, lock_memory, "false", "populate and lock the tiers at start");
ABSL_FLAG(std::string, warm_memory, "true", "populate the tiers in the background");
ABSL_FLAG(std::string, huge_pages, "auto", "transparent huge pages for the tiers");

namespace stash::daemon {
namespace {

struct Knob {
  const char* name;        // flag name, underscores (the env var is STASHD_<NAME upper>)
  const char* value_name;  // how --help shows the value
  const char* help;        // one line, with the unit
  Status (*apply)(std::string_view value, DaemonConfig* config);
};

Status ParseUint(std::string_view value, uint64_t min, uint64_t max, uint64_t* out) {
  if (value.empty()) return InvalidArgumentError("must be a number");
  uint64_t v = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return InvalidArgumentError("must be a whole number");
    if (v > (UINT64_MAX - static_cast<uint64_t>(c - '0')) / 10) {
      return InvalidArgumentError("is too large");
    }
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v < min || v > max) {
    return InvalidArgumentError("must be between " + std::to_string(min) + " and " +
                                std::to_string(max));
  }
  *out = v;
  return Status::Ok();
}

Status ParseSize(std::string_view value, uint64_t* out) {
  if (value == "0") {
    *out = 0;
    return Status::Ok();
  }
  auto parsed = ParseBytes(value);
  if (!parsed.ok()) return parsed.status();
  *out = *parsed;
  return Status::Ok();
}

Status ParseBool(std::string_view v, bool* out) {
  if (v == "true" || v == "1") {
    *out = true;
  } else if (v == "false" || v == "0") {
    *out = false;
  } else {
    return InvalidArgumentError("must be true or false");
  }
  return Status::Ok();
}

const Knob kKnobs[] = {
    {"socket", "PATH",
     "Unix socket to serve on. Default: $STASHD_SOCKET, else /run/stashd/stashd.sock, else "
     "$XDG_RUNTIME_DIR/stashd/stashd.sock (or /tmp/stashd-<uid>/) when /run/stashd is not "
     "writable",
     [](std::string_view v, DaemonConfig* c) {
       c->socket = std::string(v);
       return Status::Ok();
     }},
    {"backend", "auto|host|cuda",
     "Where pools live: cuda = GPU memory through CUDA IPC; host = POSIX shared memory "
     "standing in for GPUs (CI, laptops); auto = cuda when a GPU answers, else host",
     [](std::string_view v, DaemonConfig* c) {
       if (v == "auto") {
         c->backend = BackendChoice::kAuto;
       } else if (v == "host") {
         c->backend = BackendChoice::kHost;
       } else if (v == "cuda") {
         c->backend = BackendChoice::kCuda;
       } else {
         return InvalidArgumentError("must be one of auto, host, cuda");
       }
       return Status::Ok();
     }},
    {"pool_bytes", "SIZE",
     "Pool size per GPU (per simulated GPU on the host backend), e.g. 20GiB; rounded down to "
     "whole pages",
     [](std::string_view v, DaemonConfig* c) { return ParseSize(v, &c->pool_bytes); }},
    {"page_bytes", "SIZE",
     "Page size: a power of two from 4KiB to 1GiB. A stash wastes less than one page",
     [](std::string_view v, DaemonConfig* c) { return ParseSize(v, &c->page_bytes); }},
    {"host_tier_bytes", "SIZE",
     "Host tier size in all. host backend: one tier all pools share. cuda: pinned, mapped "
     "host memory split evenly across the GPUs, one share each (no two copy streams plan on "
     "one ring). 0 = no host tier, a full pool then overflows",
     [](std::string_view v, DaemonConfig* c) { return ParseSize(v, &c->host_tier_bytes); }},
    {"devices", "N",
     "Host backend only: how many simulated GPUs, one pool each (1..64). The cuda backend "
     "uses every visible GPU",
     [](std::string_view v, DaemonConfig* c) {
       uint64_t n = 0;
       STASH_RETURN_IF_ERROR(ParseUint(v, 1, 64, &n));
       c->devices = static_cast<uint32_t>(n);
       return Status::Ok();
     }},
    {"log_level", "LEVEL", "trace, debug, info, warn, error, critical or off",
     [](std::string_view v, DaemonConfig* c) {
       auto level = ParseLogLevel(v);
       if (!level.ok())
         return InvalidArgumentError(
             "must be one of trace, debug, info, warn, "
             "error, critical, off");
       c->log_level = std::string(v);
       return Status::Ok();
     }},
    {"log_format", "text|json",
     "How log lines look: text, or json (one object per line: time with UTC offset, level, "
     "logger, message) for log shippers",
     [](std::string_view v, DaemonConfig* c) {
       if (!ParseLogFormat(v).ok()) return InvalidArgumentError("must be text or json");
       c->log_format = std::string(v);
       return Status::Ok();
     }},
    {"listen", "HOST:PORT",
     "Also serve stats (read-only: no sessions) over TCP; a bare :PORT or PORT binds "
     "127.0.0.1; port 0 picks a free one (stashctl config shows it). Empty = off",
     [](std::string_view v, DaemonConfig* c) {
       if (v.empty()) {
         c->listen.clear();
         return Status::Ok();
       }
       std::string addr(v);
       const auto colon = addr.rfind(':');
       std::string host = colon == std::string::npos ? "" : addr.substr(0, colon);
       std::string port = colon == std::string::npos ? addr : addr.substr(colon + 1);
       uint64_t port_num = 0;
       if (!ParseUint(port, 0, 65535, &port_num).ok()) {
         return InvalidArgumentError(
             "must be HOST:PORT with a port from 0 to 65535 (0: any free one), e.g. "
             "127.0.0.1:7070");
       }
       if (host.empty()) host = "127.0.0.1";
       c->listen = host + ":" + port;
       return Status::Ok();
     }},
    {"listen_sessions", "true|false",
     "Also serve per-session rows (pids, labels, session ids) on the --listen port. Off by "
     "default: any local user can reach that port, so it serves node-level numbers only",
     [](std::string_view v, DaemonConfig* c) {
       if (v == "true" || v == "1") {
         c->listen_sessions = true;
       } else if (v == "false" || v == "0") {
         c->listen_sessions = false;
       } else {
         return InvalidArgumentError("must be true or false");
       }
       return Status::Ok();
     }},
    {"copy_threads", "N", "Threads that split one large copy on the host backend (1..64)",
     [](std::string_view v, DaemonConfig* c) {
       uint64_t n = 0;
       STASH_RETURN_IF_ERROR(ParseUint(v, 1, 64, &n));
       c->copy_threads = static_cast<uint32_t>(n);
       return Status::Ok();
     }},
    {"max_inflight", "N",
     "Requests one session may have queued before new ones get RESOURCE_EXHAUSTED "
     "(1..1048576)",
     [](std::string_view v, DaemonConfig* c) {
       uint64_t n = 0;
       STASH_RETURN_IF_ERROR(ParseUint(v, 1, 1 << 20, &n));
       c->max_inflight = static_cast<uint32_t>(n);
       return Status::Ok();
     }},
    {"drain_timeout", "SECONDS",
     "On SIGTERM, refuse new sessions and stashes and wait up to SECONDS (0..3600) for the "
     "ranks to reload what they stashed and close their sessions, then stop. A second SIGTERM "
     "stops at once. 0 = stop at once",
     [](std::string_view v, DaemonConfig* c) {
       uint64_t n = 0;
       STASH_RETURN_IF_ERROR(ParseUint(v, 0, 3600, &n));
       c->drain_timeout_s = static_cast<uint32_t>(n);
       return Status::Ok();
     }},
    {"idle_connection_timeout", "SECONDS",
     "Close a gRPC connection that carried no call for SECONDS (1..86400; a trainer's session "
     "stream is a call, so its connection never idles; clients reconnect on their next call). "
     "Independent of it, a connection that sends no HTTP/2 preface within 10 s is closed. "
     "0 = never",
     [](std::string_view v, DaemonConfig* c) {
       uint64_t n = 0;
       STASH_RETURN_IF_ERROR(ParseUint(v, 0, 86400, &n));
       c->idle_connection_timeout_s = static_cast<uint32_t>(n);
       return Status::Ok();
     }},
    {"metrics_listen", "HOST:PORT",
     "Serve Prometheus metrics at http://HOST:PORT/metrics (node-level numbers and per-session "
     "counters; no control). A bare PORT binds 127.0.0.1; port 0 picks a free one (logged). "
     "Empty = off",
     [](std::string_view v, DaemonConfig* c) {
       if (v.empty()) {
         c->metrics_listen.clear();
         return Status::Ok();
       }
       std::string addr(v);
       const auto colon = addr.rfind(':');
       std::string host = colon == std::string::npos ? "" : addr.substr(0, colon);
       const std::string port = colon == std::string::npos ? addr : addr.substr(colon + 1);
       uint64_t port_num = 0;
       if (!ParseUint(port, 0, 65535, &port_num).ok()) {
         return InvalidArgumentError(
             "must be HOST:PORT with a port from 0 to 65535, e.g. 127.0.0.1:9464");
       }
       if (host.empty()) host = "127.0.0.1";
       c->metrics_listen = host + ":" + port;
       return Status::Ok();
     }},
    {"chunk_bytes", "SIZE",
     "Mapped mode: the size of the chunks every tier is cut into and leased in, a whole number "
     "of pages (a tier's last chunk may be shorter). 0 = --pool-bytes / 32 in whole pages, at "
     "least one page and at least --host-tier-bytes / 1024. Each chunk is one open descriptor "
     "of the daemon",
     [](std::string_view v, DaemonConfig* c) { return ParseSize(v, &c->chunk_bytes); }},
    {"max_lease_bytes", "SIZE",
     "Mapped mode: the most bytes one session may lease of each tier (own device, peer devices, "
     "host), so a session that leases its pool can still spill; a larger explicit lease is "
     "refused with RESOURCE_EXHAUSTED. 0 = one device pool's bytes (--pool-bytes)",
     [](std::string_view v, DaemonConfig* c) { return ParseSize(v, &c->max_lease_bytes); }},
    {"peer_tier", "true|false",
     "Mapped mode: let a session lease other device pools' free chunks (TIER_PEER), each pool "
     "lending only while it keeps more than half its chunks free, so its own ranks come first",
     [](std::string_view v, DaemonConfig* c) { return ParseBool(v, &c->peer_tier); }},
    {"copy_peer_tier", "true|false",
     "Daemon-copy: a stash that does not fit its own device's pool goes to another device's pool "
     "(TIER_PEER; the one with the most free pages first) before the host tier. A pool lends "
     "only pages beyond a reserve for its own sessions' next stashes: 1/32 of the pool, at least "
     "a page. Host backend with --devices > 1; the "
     "cuda backend does not lend (it says so at start)",
     [](std::string_view v, DaemonConfig* c) { return ParseBool(v, &c->copy_peer_tier); }},
    {"group_peer_tier", "true|false",
     "Groups of mapped sessions (Hello.group): a member whose own device's group pages are "
     "taken claims free pages of the group's chunks on other devices (TIER_PEER) before the "
     "host tier, and a dry group grows into other devices' spare chunks. Host backend with "
     "--devices > 1",
     [](std::string_view v, DaemonConfig* c) { return ParseBool(v, &c->group_peer_tier); }},
    {"lock_memory", "true|false",
     "Host backend: populate and lock (mlock) every tier at start, with progress in the log, so "
     "the memory is the daemon's for as long as it runs; needs the locked-memory limit "
     "(LimitMEMLOCK=infinity, ulimit -l, the IPC_LOCK capability). Without it the tiers are "
     "checked against free memory at start but their pages are taken only as they are first "
     "written (the cuda backend's pinned host tier is locked either way)",
     [](std::string_view v, DaemonConfig* c) { return ParseBool(v, &c->lock_memory); }},
    {"warm_memory", "true|false",
     "Host backend: populate every tier in the background from the start (progress in the log, "
     "stashd_tier_bytes_warm), so first stashes run at copy speed instead of a page fault per "
     "page. The socket is up at once; stashes that come before their pages are warm still work. "
     "Chunks back from mapped sessions get fresh memory their next holder allocates. false: "
     "pages are taken as they are first written",
     [](std::string_view v, DaemonConfig* c) { return ParseBool(v, &c->warm_memory); }},
    {"huge_pages", "auto|off|hugetlb",
     "The tiers in host memory (every tier of the host backend, the cuda backend's host tier): "
     "auto = ask for shmem transparent huge pages (2 MiB) where "
     "/sys/kernel/mm/transparent_hugepage/shmem_enabled offers them (always, within_size, advise "
     "or force) and --chunk-bytes is a multiple of 2 MiB; off = 4 KiB pages; hugetlb (host "
     "backend only) = huge pages reserved by the kernel (vm.nr_hugepages, 2 MiB), refused at "
     "start with the numbers when too few are free, and needing --chunk-bytes, --pool-bytes and "
     "--host-tier-bytes in whole huge pages. The start-up log and stats say which each tier got",
     [](std::string_view v, DaemonConfig* c) {
       if (v == "auto") {
         c->huge_pages = HugePages::kAuto;
       } else if (v == "off") {
         c->huge_pages = HugePages::kOff;
       } else if (v == "hugetlb") {
         c->huge_pages = HugePages::kHugetlb;
       } else {
         return InvalidArgumentError("must be one of auto, off, hugetlb");
       }
       return Status::Ok();
     }},
};

std::string EnvName(std::string_view name) {
  std::string out = "STASHD_";
  for (char ch : name)
    out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  return out;
}

const Knob* FindKnob(std::string_view name) {
  for (const Knob& knob : kKnobs) {
    if (name == knob.name) return &knob;
  }
  return nullptr;
}

std::string DefaultOf(const Knob& knob) {
  return absl::FindCommandLineFlag(knob.name)->DefaultValue();
}

}  // namespace

const char* BackendChoiceName(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::kAuto:
      return "auto";
    case BackendChoice::kHost:
      return "host";
    case BackendChoice::kCuda:
      return "cuda";
  }
  return "auto";
}

std::string UsageText() {
  std::ostringstream out;
  out << "stashd: the per-node activation stash daemon.\n\n"
         "Training ranks register the activation buffers autograd saves for backward; stashd\n"
         "pages them into a pool it owns (spilling to the host tier when full) and copies them\n"
         "back on backward. Runs in the foreground; SIGTERM or SIGINT stops it cleanly.\n\n"
         "Usage: stashd [--knob=value ...]\n\n"
         "Every knob is also read from the environment variable shown; a flag wins over it.\n"
         "Sizes take a unit: B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB), e.g. 512MiB.\n\n";
  for (const Knob& knob : kKnobs) {
    const std::string def = DefaultOf(knob);
    out << "  --" << Dashed(knob.name) << "=" << knob.value_name << "\n"
        << Wrap(std::string(knob.help) + ".", 88, "      ")
        << "      default: " << (def.empty() ? "(none)" : def) << "; env: " << EnvName(knob.name)
        << "\n";
  }
  out << "\n  --print-config   print the effective configuration as JSON and exit\n"
         "  --version        print the version and exit\n"
         "  --help           print this text and exit\n\n"
         "Inspect a running daemon with `stashctl stats` (see `stashctl --help`).\n";
  return out.str();
}

namespace {

// "--page-bytes=X" or "STASHD_PAGE_BYTES=X", whichever the value came from.
std::string Named(const DaemonConfig& config, std::string_view name, uint64_t value) {
  for (const DaemonConfig::Entry& e : config.entries) {
    if (e.name == name && e.source == "env") return EnvName(name) + "=" + e.value;
    if (e.name == name && e.source != "env") return "--" + Dashed(name) + "=" + e.value;
  }
  return "--" + Dashed(name) + "=" + std::to_string(value);
}

}  // namespace

Status ValidateConfig(DaemonConfig& config) {
  const uint64_t page = config.page_bytes;
  if (page < (4ULL << 10) || page > (1ULL << 30) || (page & (page - 1)) != 0) {
    return InvalidArgumentError(Named(config, "page_bytes", page) +
                                ": must be a power of two from 4KiB to 1GiB, e.g. 256KiB");
  }
  if (config.pool_bytes < page) {
    return InvalidArgumentError(
        Named(config, "pool_bytes", config.pool_bytes) +
        ": must hold at least one page (--page-bytes=" + std::to_string(page) + ")");
  }
  if (config.host_tier_bytes != 0 && config.host_tier_bytes < page) {
    return InvalidArgumentError(Named(config, "host_tier_bytes", config.host_tier_bytes) +
                                ": must be 0 (no host tier) or hold at least one page "
                                "(--page-bytes=" +
                                std::to_string(page) + ")");
  }
  if (config.chunk_bytes % page != 0) {
    return InvalidArgumentError(
        Named(config, "chunk_bytes", config.chunk_bytes) +
        ": must be 0 (automatic) or a whole number of pages (--page-bytes=" + std::to_string(page) +
        ")");
  }
  return Status::Ok();
}

StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine result;
  // Pre-scan: our own actions, dashed names, and unknown flags (abseil would exit(1) on them;
  // a bad command line exits 2 with one line here).
  std::vector<std::string> storage;
  std::vector<std::string> given;  // knob names set on the command line
  storage.reserve(static_cast<size_t>(argc));
  storage.emplace_back(argc > 0 ? argv[0] : "stashd");
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      result.action = CommandLine::Action::kHelp;
      return result;
    }
    if (arg == "--version") {
      result.action = CommandLine::Action::kVersion;
      return result;
    }
    if (arg == "--print-config" || arg == "--print_config") {
      result.action = CommandLine::Action::kPrintConfig;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return InvalidArgumentError("unexpected argument '" + arg +
                                  "': stashd takes only --knob=value flags (see stashd --help)");
    }
    const auto eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    for (char& ch : name) {
      if (ch == '-') ch = '_';
    }
    const Knob* knob = FindKnob(name);
    if (knob == nullptr) {
      return InvalidArgumentError("unknown flag '" + arg.substr(0, eq) +
                                  "' (see stashd --help for the knobs)");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (std::string_view(knob->value_name) == "true|false") {
      value = "true";  // a switch: --peer-tier is --peer-tier=true
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return InvalidArgumentError("flag --" + Dashed(name) + " needs a value, e.g. --" +
                                  Dashed(name) + "=VALUE");
    }
    storage.push_back("--" + name + "=" + value);
    given.push_back(name);
  }
  std::vector<char*> args;
  args.reserve(storage.size());
  for (std::string& s : storage) args.push_back(s.data());
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());

  DaemonConfig& config = result.config;
  for (const Knob& knob : kKnobs) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(knob.name);
    std::string value;
    std::string source;
    std::string shown;  // how an error names where the value came from
    const std::string env_name = EnvName(knob.name);
    const char* env = std::getenv(env_name.c_str());
    if (std::find(given.begin(), given.end(), knob.name) != given.end()) {
      value = flag->CurrentValue();
      source = "flag";
      shown = "--" + Dashed(knob.name) + "=" + value;
    } else if (env != nullptr) {
      value = env;
      source = "env";
      shown = env_name + "=" + value;
    } else {
      value = flag->DefaultValue();
      source = "default";
      shown = "default " + Dashed(knob.name) + "=" + value;
    }
    Status status = knob.apply(value, &config);
    if (!status.ok()) {
      // Size errors already quote the value; say which knob and source it came from.
      return InvalidArgumentError(shown + ": " + status.message());
    }
    config.entries.push_back({knob.name, value, source, knob.help});
  }
  STASH_RETURN_IF_ERROR(ValidateConfig(config));
  result.warnings = UnknownEnvWarnings(environ);
  return result;
}

namespace {

// Edit distance, for "did you mean".
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> UnknownEnvWarnings(char** env) {
  // Read by the client library, the Slurm scripts, the image build and the tests, not stashd.
  static const char* const kOthers[] = {"STASHD_CLIENT_LIB", "STASHD_BIN_DIR",
                                        "STASHD_GID",        "STASHD_TEST_SEED",
                                        "STASHD_MARKER",     "STASHD_MARKER_ATTRIBUTE"};
  std::vector<std::string> out;
  if (env == nullptr) return out;
  std::string known;
  for (const Knob& knob : kKnobs) known += (known.empty() ? "" : ", ") + EnvName(knob.name);
  for (char** e = env; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("STASHD_", 0) != 0) continue;
    const std::string name(entry.substr(0, entry.find('=')));
    bool found = false;
    std::string closest;
    size_t best = SIZE_MAX;
    for (const Knob& knob : kKnobs) {
      const std::string env_name = EnvName(knob.name);
      if (env_name == name) found = true;
      if (const size_t d = Distance(name, env_name); d < best) {
        best = d;
        closest = env_name;
      }
    }
    for (const char* other : kOthers) found = found || name == other;
    if (found) continue;
    std::string line = name + " is set but is no stashd knob; it is ignored.";
    if (best <= 3) line += " Did you mean " + closest + "?";
    out.push_back(line + " The knobs: " + known);
  }
  return out;
}

uint64_t ChunkPages(const DaemonConfig& config) {
  const uint64_t page = config.page_bytes;
  if (config.chunk_bytes != 0) return config.chunk_bytes / page;
  const uint64_t host_pages = config.host_tier_bytes / page;
  return std::max<uint64_t>({1, config.pool_bytes / page / 32, (host_pages + 1023) / 1024});
}

}  // namespace stash::daemon

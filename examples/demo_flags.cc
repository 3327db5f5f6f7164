#include "examples/demo_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "examples/routing.h"

namespace stash::demo {
namespace {

// One activation buffer (max_tokens * hidden fp32) may not exceed this: each rank holds a few
// dozen of them (reference and stashed run), and they are shared memory.
constexpr int64_t kMaxActivationBytes = int64_t{256} << 20;

struct FlagSpec {
  const char* name;        // without the leading dashes, words joined by '-'
  const char* value_name;  // how --help shows the value
  const char* fallback;    // the default as --help prints it
  const char* help;        // what it does, with its range
  // Parses `value` into `flags`; returns an empty string or why the value is wrong.
  std::string (*apply)(std::string_view value, DemoFlags* flags);
};

std::string ParseInt(std::string_view value, int64_t min, int64_t max, int* out) {
  const std::string text(value);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const std::string range =
      "a whole number from " + std::to_string(min) + " to " + std::to_string(max);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max) {
    return "must be " + range + ", not '" + text + "'";
  }
  *out = static_cast<int>(v);
  return {};
}

std::string ParseSeed(std::string_view value, uint64_t* out) {
  const std::string text(value);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE) {
    return "must be a whole number from 0 to 18446744073709551615, not '" + text + "'";
  }
  *out = v;
  return {};
}

std::string ParseFactor(std::string_view value, double* out) {
  const std::string text(value);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v <= 0.0 ||
      v > 64.0) {
    return "must be a number above 0 and at most 64, not '" + text + "'";
  }
  *out = v;
  return {};
}

// "64MiB", "96KiB", "4096": bytes with an optional KiB / MiB / GiB suffix.
std::string ParseBytes(std::string_view value, uint64_t* out) {
  uint64_t unit = 1;
  for (const auto& [suffix, bytes] : {std::pair<std::string_view, uint64_t>{"KiB", 1ull << 10},
                                      {"MiB", 1ull << 20},
                                      {"GiB", 1ull << 30}}) {
    if (value.size() > suffix.size() && value.substr(value.size() - suffix.size()) == suffix) {
      unit = bytes;
      value.remove_suffix(suffix.size());
      break;
    }
  }
  if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos ||
      value.size() > 12) {
    return "must be bytes with an optional KiB, MiB or GiB suffix, not '" + std::string(value) +
           "'";
  }
  *out = std::stoull(std::string(value)) * unit;
  return {};
}

// "auto" or "device=SIZE,peer=SIZE,host=SIZE" (any of the three).
std::string ParseLease(std::string_view value, DemoFlags* f) {
  if (value == "auto") {
    f->lease_automatic = true;
    return {};
  }
  f->lease_automatic = false;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return "must be auto or device=SIZE,peer=SIZE,host=SIZE, not '" + std::string(item) + "'";
    }
    const std::string_view tier = item.substr(0, eq);
    uint64_t* target = tier == "device" ? &f->lease_device_bytes
                       : tier == "peer" ? &f->lease_peer_bytes
                       : tier == "host" ? &f->lease_host_bytes
                                        : nullptr;
    if (target == nullptr)
      return "tiers are device, peer and host, not '" + std::string(tier) + "'";
    if (std::string e = ParseBytes(item.substr(eq + 1), target); !e.empty()) return e;
  }
  return {};
}

const FlagSpec kFlags[] = {
    {"socket", "PATH", "(empty)",
     "stashd's Unix socket. Empty = $STASHD_SOCKET, else the client's default "
     "(/run/stashd/stashd.sock, else the per-user fallback stashd uses)",
     [](std::string_view v, DemoFlags* f) {
       f->socket = std::string(v);
       return std::string();
     }},
    {"backend", "host|cuda", "host",
     "The daemon's backend. host: ranks compute on the CPU, activations in shared memory. "
     "cuda: ranks compute on the GPU (CUDA grouped linear) and stash device memory through CUDA "
     "IPC, ordered by stream memory operations; needs a GPU, stashd --backend=cuda and a build "
     "with CUDA",
     [](std::string_view v, DemoFlags* f) {
       if (v != "host" && v != "cuda") {
         return "must be host or cuda, not '" + std::string(v) + "'";
       }
#if !STASH_DEMO_CUDA
       if (v == "cuda") {
         return std::string("cuda: this stash-demo was built without CUDA (STASH_ENABLE_CUDA=OFF)");
       }
#endif
       f->backend = std::string(v);
       return std::string();
     }},
    {"mode", "daemon-copy|mapped", "daemon-copy",
     "Who runs the copies. daemon-copy: the ranks register their buffers and the daemon copies. "
     "mapped: the daemon leases pool chunks to each rank, which pages its activations itself "
     "(host backend only)",
     [](std::string_view v, DemoFlags* f) {
       if (v != "daemon-copy" && v != "mapped") {
         return "must be daemon-copy or mapped, not '" + std::string(v) + "'";
       }
       f->mode = std::string(v);
       return std::string();
     }},
    {"lease", "auto|device=SIZE,peer=SIZE,host=SIZE", "auto",
     "Mapped mode: the lease per rank. auto: the daemon sizes it at every step; else bytes per "
     "tier (suffix KiB, MiB, GiB)",
     [](std::string_view v, DemoFlags* f) { return ParseLease(v, f); }},
    {"ranks", "N", "4", "Rank processes, one Client each (1..256)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 256, &f->ranks); }},
    {"devices", "N", "1",
     "Devices the ranks spread over: rank r opens device r % N. Set it to the daemon's "
     "--devices (1..64); a larger value fails with 'device out of range'",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 64, &f->devices); }},
    {"layers", "N", "4", "Grouped-linear layers per step; each stashes its input (1..64)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 64, &f->layers); }},
    {"experts", "N", "8", "Experts per layer (1..1024)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 1024, &f->experts); }},
    {"topk", "K", "2", "Experts each token is routed to (1..--experts)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 1024, &f->topk); }},
    {"hidden", "N", "256", "Features in and out of every layer; a row is 4 * N bytes (1..16384)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 16384, &f->hidden); }},
    {"tokens", "N", "512", "Tokens per rank per step, before top-k routing (1..1048576)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 1 << 20, &f->tokens); }},
    {"steps", "N", "3", "Training steps (1..100000)",
     [](std::string_view v, DemoFlags* f) { return ParseInt(v, 1, 100000, &f->steps); }},
    {"seed", "N", "1",
     "Base seed: routing and inputs of rank r at step s use seed (N, r, s), weights (N, layer)",
     [](std::string_view v, DemoFlags* f) { return ParseSeed(v, &f->seed); }},
    {"capacity-factor", "F", "1.5",
     "Static budget: max_tokens = round_up(tokens * topk * F, 32) rows per layer; routed "
     "tokens beyond it are dropped and counted (0 < F <= 64)",
     [](std::string_view v, DemoFlags* f) { return ParseFactor(v, &f->capacity_factor); }},
    {"hold-command", "CMD", "(none)",
     "Once every rank holds its last step's stashes (forward done, backward not started), run "
     "CMD with /bin/sh and wait for it; the ranks then finish. $STASH_DEMO_RANK_PIDS holds the "
     "ranks' pids. E.g. --hold-command='stashctl stats' shows the pages the ranks hold",
     [](std::string_view v, DemoFlags* f) {
       f->hold_command = std::string(v);
       return std::string();
     }},
};

const FlagSpec* FindFlag(std::string_view name) {
  for (const FlagSpec& spec : kFlags) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

// `text` wrapped at 80 columns, each line indented by `indent` spaces.
std::string Wrap(const std::string& text, size_t indent) {
  constexpr size_t kWidth = 80;
  std::string out;
  std::string line(indent, ' ');
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (line.size() > indent && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.assign(indent, ' ');
    }
    if (line.size() > indent) line += ' ';
    line += word;
    start = end + 1;
  }
  return out + line + "\n";
}

ParsedCommandLine Error(std::string message) {
  ParsedCommandLine out;
  out.action = ParsedCommandLine::Action::kError;
  out.error = std::move(message);
  return out;
}

}  // namespace

ParsedCommandLine ParseDemoCommandLine(int argc, char** argv) {
  ParsedCommandLine out;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      out.action = ParsedCommandLine::Action::kHelp;
      return out;
    }
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return Error("unexpected argument '" + std::string(arg) +
                   "': flags look like --name=value (see --help)");
    }
    std::string name(arg.substr(2));
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    const FlagSpec* spec = FindFlag(name);
    if (spec == nullptr) return Error("unknown flag --" + name + " (see --help)");
    if (!has_value) {
      if (i + 1 >= argc) return Error("--" + name + " needs a value (--" + name + "=VALUE)");
      value = argv[++i];
    }
    if (std::string why = spec->apply(value, &out.flags); !why.empty()) {
      return Error("--" + name + " " + why);
    }
  }

  const DemoFlags& f = out.flags;
  if (f.topk > f.experts) {
    return Error("--topk " + std::to_string(f.topk) + " must be at most --experts " +
                 std::to_string(f.experts));
  }
  const int64_t budget = TokenBudget(f.tokens, f.topk, f.capacity_factor);
  if (budget < 0 || budget > kMaxActivationBytes / (4 * int64_t{f.hidden})) {
    return Error(
        "--tokens * --topk * --capacity-factor * --hidden is too large: one layer's "
        "input would pass " +
        std::to_string(kMaxActivationBytes >> 20) + " MiB");
  }
  return out;
}

std::string DemoUsage() {
  std::string out =
      "stash-demo: MoE training ranks that stash their activations in stashd.\n"
      "\n"
      "Forks --ranks processes (before any client call), each a training rank with its own\n"
      "stashd session. Every step a rank routes its tokens top-k over the experts (segments\n"
      "padded to 32 rows, a static budget of max_tokens rows), runs --layers grouped-linear\n"
      "layers forward and stashes each layer's input in the daemon, the row count passed by\n"
      "reference and published by a ready event. Once the daemon confirms a copy the rank\n"
      "poisons its own buffer; backward reloads every input in reverse order into a poisoned\n"
      "buffer (zero tail) and computes the input and weight gradients. A stash that overflowed\n"
      "stays in the rank. Outputs and gradients must equal, bit for bit, the same step computed\n"
      "first with the activations kept in the process.\n"
      "\n"
      "Usage: stash-demo [--flag=value ...]   (or --flag value)\n"
      "\n"
      "Start a daemon first, e.g.\n"
      "  stashd --socket=/tmp/d/s.sock --devices=4 --pool-bytes=64MiB --host-tier-bytes=64MiB\n"
      "  stash-demo --socket=/tmp/d/s.sock --devices=4\n"
      "\n";
  for (const FlagSpec& spec : kFlags) {
    out += "  --" + std::string(spec.name) + "=" + spec.value_name + "\n" +
           Wrap(std::string(spec.help) + ".", 6) + "      default: " + spec.fallback + "\n";
  }
  out +=
      "\n"
      "Exit status: 0 when parity holds on every rank; 1 when a rank failed (no daemon, a\n"
      "daemon error, a parity mismatch); 2 for bad flags.\n";
  return out;
}

}  // namespace stash::demo

// stash-bench-gpu: a standalone GPU benchmark of the CUDA data path (CUDA runtime only: no
// daemon, no gRPC). Parses the command line, checks for a device and runs one subcommand.
#include <signal.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/gpu/common.h"

namespace stash::bench_gpu {
namespace {

const char kUsage[] =
    "stash-bench-gpu: GPU benchmarks of stashd's CUDA data path (CUDA runtime only: no daemon,\n"
    "no gRPC). Each subcommand prints a table; --json FILE also writes the figures as JSON.\n"
    "\n"
    "Usage: stash-bench-gpu <copy|ipc|overlap|mapped-overlap|wait|peer> [--flag=value ...]\n"
    "       (or --flag value)\n"
    "\n"
    "Subcommands:\n"
    "  copy     Stash (LaunchStash) and reload (LaunchReload) of the paging kernels into a\n"
    "           device pool of 256 KiB pages with a permuted free ring, against\n"
    "           cudaMemcpyAsync device-to-device and a plain SM copy kernel of the same\n"
    "           bytes, at each --sizes size: GB/s, the share of the memory peak, and the\n"
    "           ratio to the faster baseline (target >= 0.90x from 64 MiB up), GPU time\n"
    "           from events, median of --iters (default 20). Every size is verified once\n"
    "           (the reloaded buffer must equal the source). Also the host cost of\n"
    "           LaunchStash's kernel launches (the daemon's whole per-request cost is\n"
    "           stash-bench-request's).\n"
    "  ipc      With a child process exporting --iters (default 20) 64 MiB buffers and\n"
    "           interprocess events: cudaIpcOpenMemHandle (first open, same handle again,\n"
    "           and an unordered_map lookup as the cached path), cudaIpcCloseMemHandle,\n"
    "           cudaIpcOpenEventHandle, and cudaHostRegister(cudaHostRegisterMapped) of a\n"
    "           4 KiB POSIX shm page (how counter events are mapped). Medians, in us.\n"
    "  overlap  Does a copy launched by another process stall the trainer? A child process\n"
    "           runs --iters (default 1000) launches of a compute-bound FMA kernel on every\n"
    "           SM (about --launch-ms each) alone, while this process stashes and reloads\n"
    "           --copy-mib MiB with the paging kernels, while it does so with batched\n"
    "           memcpy calls (copy engine), each flat out and paced to the same GB/s, and\n"
    "           alone again: the trainer's time, its slowdown, the trainer ms lost per GB\n"
    "           moved and the copier's GB/s. About 15-25 s.\n"
    "  mapped-overlap\n"
    "           The overlap experiment with mapped mode: the trainer child runs the\n"
    "           product's StreamCopier itself, on a side stream, into VMM chunks leased\n"
    "           to it (VmmChunkMemory + CudaLeaseMemory), against the daemon-copy kernels\n"
    "           from this process and against nothing, flat out and paced to one GB/s;\n"
    "           once with CUDA_DEVICE_MAX_CONNECTIONS unset and once with it set to 1 in\n"
    "           the trainer. About 30-45 s.\n"
    "  wait     With CUDA_DEVICE_MAX_CONNECTIONS=1 and without: how long another stream\n"
    "           of a trainer is held while one stream waits (cuStreamWaitValue64) for a\n"
    "           counter raised an SM copy of --copy-mib MiB later; two child processes,\n"
    "           --iters trials each (default 20), in us.\n"
    "  peer     Mapped mode's peer tier (needs 2 GPUs): a VMM pool on --peer-device, its\n"
    "           chunks mapped into the peer tier of --device, StreamCopier stash and\n"
    "           reload at each --sizes size (default 256,1024 MiB) against an SM copy\n"
    "           kernel through the same mapping and cudaMemcpyPeerAsync: GB/s, median of\n"
    "           --iters (default 10). With one GPU, or no peer access, reports skipped.\n"
    "\n"
    "Flags:\n"
    "  --device=N       CUDA device (default 0)\n"
    "  --peer-device=N  peer: the GPU whose chunks are leased (default --device + 1)\n"
    "  --iters=N        iterations per size (copy, peer), allocations (ipc), trainer launches\n"
    "                   per round (overlap, mapped-overlap); 1..100000, default per\n"
    "                   subcommand as above\n"
    "  --sizes=LIST     copy, peer: comma-separated sizes in MiB, 1..65536 each\n"
    "                   (copy: default 1,16,64,256,1024, the pool twice the largest;\n"
    "                   peer: default 256,1024, the peer pool the largest)\n"
    "  --copy-mib=N     overlap, mapped-overlap, wait: bytes of one stash, MiB, 1..65536\n"
    "                   (default 256)\n"
    "  --launch-ms=F    overlap, mapped-overlap: the trainer kernel's time per launch, ms,\n"
    "                   0.05..100\n"
    "                   (default 1.5)\n"
    "  --json=FILE      also write the results as JSON to FILE\n"
    "  --help           this text\n"
    "\n"
    "Exit status: 0 done (targets missed are reported, not failures); 1 a CUDA call failed or\n"
    "a copy did not verify; 2 bad flags or no CUDA device.\n";

bool ParseInt(const std::string& text, int64_t min, int64_t max, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max) return false;
  *out = v;
  return true;
}

// Returns "" or why the flag is wrong.
std::string ApplyFlag(const std::string& name, const std::string& value, Options* options) {
  int64_t v = 0;
  if (name == "device") {
    if (!ParseInt(value, 0, 1023, &v)) return "must be a device index from 0 to 1023";
    options->device = static_cast<int>(v);
  } else if (name == "peer-device") {
    if (!ParseInt(value, 0, 1023, &v)) return "must be a device index from 0 to 1023";
    options->peer_device = static_cast<int>(v);
  } else if (name == "iters") {
    if (!ParseInt(value, 1, 100000, &v)) return "must be a whole number from 1 to 100000";
    options->iters = static_cast<int>(v);
  } else if (name == "sizes") {
    options->sizes_given = true;
    options->sizes_mib.clear();
    size_t start = 0;
    while (start <= value.size()) {
      size_t comma = value.find(',', start);
      if (comma == std::string::npos) comma = value.size();
      if (!ParseInt(value.substr(start, comma - start), 1, 65536, &v)) {
        return "must be a comma-separated list of sizes in MiB, 1 to 65536 each";
      }
      options->sizes_mib.push_back(v);
      start = comma + 1;
    }
  } else if (name == "copy-mib") {
    if (!ParseInt(value, 1, 65536, &v)) return "must be a size in MiB from 1 to 65536";
    options->copy_mib = v;
  } else if (name == "launch-ms") {
    char* end = nullptr;
    const double ms = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(ms >= 0.05 && ms <= 100.0)) {
      return "must be a number of milliseconds from 0.05 to 100";
    }
    options->launch_ms = ms;
  } else if (name == "json") {
    if (value.empty()) return "needs a file name";
    options->json_path = value;
  } else {
    return "is not a flag (see --help)";
  }
  return "";
}

enum class Parsed { kRun, kHelp, kError };

Parsed ParseCommandLine(int argc, char** argv, Options* options, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "help") return Parsed::kHelp;
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      if (!options->command.empty()) {
        *error = "unexpected argument '" + std::string(arg) + "' after the subcommand " +
                 options->command;
        return Parsed::kError;
      }
      options->command = std::string(arg);
      continue;
    }
    std::string name(arg.substr(2));
    std::string value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      *error = "--" + name + " needs a value (--" + name + "=VALUE)";
      return Parsed::kError;
    }
    if (std::string why = ApplyFlag(name, value, options); !why.empty()) {
      *error = "--" + name + " " + why + ", not '" + value + "'";
      return Parsed::kError;
    }
  }
  if (options->command.empty()) {
    *error = "no subcommand: say copy, ipc, overlap, mapped-overlap, wait or peer";
    return Parsed::kError;
  }
  return Parsed::kRun;
}

int Main(int argc, char** argv) {
  // A child that died must not kill us through a write to its pipe.
  signal(SIGPIPE, SIG_IGN);
  Options options;
  std::string error;
  switch (ParseCommandLine(argc, argv, &options, &error)) {
    case Parsed::kHelp:
      std::fputs(kUsage, stdout);
      return 0;
    case Parsed::kError:
      std::fprintf(stderr, "stash-bench-gpu: %s (see --help)\n", error.c_str());
      return 2;
    case Parsed::kRun:
      break;
  }
  // The child roles: started by ipc, overlap, mapped-overlap and wait, which checked the device
  // already.
  if (options.command == "ipc-child") return RunIpcChild(options);
  if (options.command == "overlap-trainer") return RunOverlapTrainer(options);
  if (options.command == "mapped-trainer") return RunMappedTrainer(options);
  if (options.command == "wait-child") return RunWaitChild(options);
  if (options.command != "copy" && options.command != "ipc" && options.command != "overlap" &&
      options.command != "mapped-overlap" && options.command != "wait" &&
      options.command != "peer") {
    std::fprintf(stderr,
                 "stash-bench-gpu: unknown subcommand '%s': say copy, ipc, overlap, "
                 "mapped-overlap, wait or peer (see --help)\n",
                 options.command.c_str());
    return 2;
  }

  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    std::fprintf(stderr, "stash-bench-gpu: no CUDA device (cudaGetDeviceCount: %s)\n",
                 cudaGetErrorString(status));
    return 2;
  }
  if (devices == 0) {
    std::fprintf(stderr, "stash-bench-gpu: no CUDA device (cudaGetDeviceCount: 0 devices)\n");
    return 2;
  }
  if (options.device >= devices) {
    std::fprintf(stderr, "stash-bench-gpu: --device %d, but there are only %d CUDA devices\n",
                 options.device, devices);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // tables appear as they are printed
  if (options.command == "copy") return RunCopy(options);
  if (options.command == "ipc") return RunIpc(options);
  if (options.command == "wait") return RunWait(options);
  if (options.command == "mapped-overlap") return RunMappedOverlap(options);
  if (options.command == "peer") return RunPeer(options);
  return RunOverlap(options);
}

}  // namespace
}  // namespace stash::bench_gpu

int main(int argc, char** argv) { return stash::bench_gpu::Main(argc, argv); }

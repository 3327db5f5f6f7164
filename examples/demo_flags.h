// The stash-demo command line: a small hand-written parser (the demo links only the public
// client library, so it brings no flags library of its own into the rank processes).
#ifndef STASH_EXAMPLES_DEMO_FLAGS_H_
#define STASH_EXAMPLES_DEMO_FLAGS_H_

#include <cstdint>
#include <string>

namespace stash::demo {

// Every knob of one demo run. The defaults here are the ones --help prints.
struct DemoFlags {
  std::string socket;            // empty = the client resolves ($STASHD_SOCKET, then default)
  std::string backend = "host";  // host: CPU ranks, shared memory; cuda: GPU ranks, CUDA IPC
  std::string mode =
      "daemon-copy";  // daemon-copy: the daemon copies; mapped: ranks page leased chunks
  // Mapped mode's lease: automatic (the default), else bytes per tier.
  bool lease_automatic = true;
  uint64_t lease_device_bytes = 0, lease_peer_bytes = 0, lease_host_bytes = 0;
  int ranks = 4;                 // rank processes
  int devices = 1;               // rank r trains on device r % devices
  int layers = 4;                // grouped-linear layers per step
  int experts = 8;               // experts per layer
  int topk = 2;                  // experts each token is routed to
  int hidden = 256;              // features in and out of every layer
  int tokens = 512;              // tokens per rank per step, before routing
  int steps = 3;                 // training steps
  uint64_t seed = 1;             // base seed of routing, inputs and weights
  double capacity_factor = 1.5;  // static budget = tokens * topk * capacity_factor, padded
  // Run by /bin/sh while every rank holds its last step's stashes (after that forward pass,
  // before its backward); the ranks go on when it exits. Empty = none.
  std::string hold_command;
};

struct ParsedCommandLine {
  enum class Action { kRun, kHelp, kError };
  Action action = Action::kRun;
  DemoFlags flags;
  std::string error;  // kError: one line saying which flag is wrong and why
};

// Parses `--name=value` and `--name value` (dashes or underscores in names), `-h`, `--help`.
// Checks every value's range and the combinations (topk <= experts, buffer sizes).
ParsedCommandLine ParseDemoCommandLine(int argc, char** argv);

// The --help text: what the demo does, every flag with its default, the exit codes.
std::string DemoUsage();

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_DEMO_FLAGS_H_

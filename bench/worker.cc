#include "bench/worker.h"

#include <cstdio>

#include "bench/sharing_worker.h"
#include "bench/worker_session.h"

namespace stash::bench {

int RunWorker(const Flags& flags) {
  const std::string task = Flag(flags, "task");
  Status status;
  if (task == "copy") {
    status = RunCopy(flags);
  } else if (task == "latency") {
    status = RunLatency(flags);
  } else if (task == "saturate") {
    // --kind=stash|ping (before mapped mode this was --mode=stash|ping, still accepted).
    std::string kind = Flag(flags, "kind", "stash");
    Flags rest = flags;
    const std::string mode = Flag(flags, "mode");
    if (mode == "stash" || mode == "ping") {
      kind = mode;
      rest.erase("mode");
    }
    status = kind == "ping" ? RunSaturatePing(rest) : RunSaturateStash(rest);
  } else if (task == "throughput") {
    status = RunThroughput(flags);
  } else if (task == "memory") {
    status = RunMemory(flags);
  } else if (task == "blocked") {
    status = RunBlocked(flags);
  } else if (task == "roundtrip") {
    status = RunRoundTrip(flags);
  } else if (task == "rank") {
    return RunRankWorker(flags);  // bench/sharing_worker.h
  } else {
    status = InvalidArgumentError("unknown --task=" + task);
  }
  return status.ok() ? 0 : Fail(status);
}

}  // namespace stash::bench

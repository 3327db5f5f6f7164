// The rank process of stash-bench's sharing phase (--role=worker --task=rank): one training
// rank of the node, stashing and reloading what the orchestrator's model says, in lock step
// with the node's other ranks. It opens one session (--mode=daemon-copy|mapped, --device,
// --rank; mapped sessions lease automatically, as a trainer would) and allocates one source and
// one destination of --max-rows x --row-bytes, then prints "ready" and answers each stdin line:
//   b <step>                       BeginStep(step); "ok" once answered (from --warmup on, then
//                                  reads the pool's pages in use: mapped leases held)
//   o s<slot>:<rows> r<slot> ...   stash <rows> rows as stash <slot> / reload stash <slot>, all
//                                  queued first and then waited for; "ok"
//   end                            "result stashes=... overflows=... spills=... peers=...
//                                  pool_high_water=...
//                                  host_high_water=... pool_used_at_step_max=...
//                                  pages_leftover=..." and exit
// A stash that overflowed has no ticket: its reload is skipped (the rank kept its buffer).
// Overflows and spills are counted from step --warmup on; the reload of every stash is checked
// against its source bytes.
#ifndef STASH_BENCH_SHARING_WORKER_H_
#define STASH_BENCH_SHARING_WORKER_H_

#include <map>
#include <string>

namespace stash::bench {

// Runs the task; returns the process exit code.
int RunRankWorker(const std::map<std::string, std::string>& flags);

}  // namespace stash::bench

#endif  // STASH_BENCH_SHARING_WORKER_H_

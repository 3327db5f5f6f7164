// The client side of stash-bench: one exec'd process per worker, talking to a real stashd
// through libstash_client (static twin) and reporting on stdout, one line per answer:
//   ready                      set up; waiting for "go <milliseconds>" on stdin (saturate)
//   result key=value ...       the measurements
//   error <text>               and a non-zero exit
//
// Tasks (--task=):
//   copy      Stash+Wait and Reload+Wait of one --bytes buffer, interleaved with a memcpy of the
//             same bytes in this process (the baseline), --reps times; GetStats copy rates.
//   latency   Stash() return time, 4 KiB Stash+Wait and Reload+Wait round trips, against unary
//             and streaming pings of the Ping server on --ping-socket and stash.v1 GetStats.
//   saturate  --window requests in flight, stashes then reloads of 4 KiB (--mode=stash) or unary
//             pings (--mode=ping), for the time "go" names; reports the count.
//   memory    stashes the layers of a routed MoE step (--tokens per layer) forward and reloads
//             them backward, BF16 on device 0 and MXFP8 on device 1; reports the pools' high
//             water marks.
#ifndef STASH_BENCH_WORKER_H_
#define STASH_BENCH_WORKER_H_

#include <map>
#include <string>

namespace stash::bench {

// Runs the task the flags name; returns the process exit code.
int RunWorker(const std::map<std::string, std::string>& flags);

}  // namespace stash::bench

#endif  // STASH_BENCH_WORKER_H_

// The client side of stash-bench: one exec'd process per worker, talking to a real stashd
// through libstash_client (static twin) and reporting on stdout, one line per answer:
//   ready                      set up; waiting for "go <milliseconds>" on stdin (saturate)
//   result key=value ...       the measurements
//   error <text>               and a non-zero exit
//
// Tasks (--task=):
//   copy        Stash+Wait and Reload+Wait of one --bytes buffer, interleaved with a memcpy of
//               the same bytes in this process (the baselines: one thread, and split over
//               --memcpy-threads threads with CopyWorkers as the copiers split), --reps times;
//               GetStats copy rates.
//   latency     Stash() return time, 4 KiB Stash+Wait and Reload+Wait round trips, against unary
//               and streaming pings of the Ping server on --ping-socket and stash.v1 GetStats.
//   saturate    --window requests in flight, stashes then reloads of 4 KiB (--kind=stash) or
//               unary pings (--kind=ping), for the time "go" names; reports the count.
//   throughput  Stash+Wait then Reload+Wait of one --bytes buffer, over and over for the time
//               "go" names; reports the bytes moved (the clients phase runs several at once).
//   memory      stashes the layers of a routed MoE step (--tokens per layer) forward and reloads
//               them backward, BF16 on device 0 and MXFP8 on device 1; reports the pools' high
//               water marks.
//   blocked, roundtrip   the idle phase's holders and its round-trip probe.
//   rank        one rank of the sharing phase, in lock step with the others
//               (bench/sharing_worker.h).
//
// The session (copy, latency, saturate, throughput): --mode=daemon-copy (default) or
// --mode=mapped; mapped sessions lease --lease-bytes of their device's pool explicitly
// (lease.automatic = false; default: what the task's buffers need, twice the buffer for copy and
// throughput) and copy with --copy-threads (Options.copy_threads, default 2). Every task checks
// with GetStats that the daemon shows the session in the mode asked for.
#ifndef STASH_BENCH_WORKER_H_
#define STASH_BENCH_WORKER_H_

#include <map>
#include <string>

namespace stash::bench {

// Runs the task the flags name; returns the process exit code.
int RunWorker(const std::map<std::string, std::string>& flags);

}  // namespace stash::bench

#endif  // STASH_BENCH_WORKER_H_

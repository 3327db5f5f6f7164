// --task=memory, blocked and roundtrip: the memory and idle phases' workers (bench/worker.h).
#include "bench/worker_session.h"

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/ping.h"
#include "bench/samples.h"
#include "bench/warm_probe.h"
#include "common/macros.h"

namespace stash::bench {

namespace v1 = stash::v1;
namespace pb = stashbench::v1;

// ---- memory ---------------------------------------------------------------------------------

namespace {

struct MemoryBuffer {
  uint64_t row_bytes;
  uint32_t divisor;
};

// Forward then backward through `tokens` (one entry per layer) on one client; returns the
// pool's high water mark and checks every page came back.
Status RunMemoryOnPool(Client& client, const HostBuffer& source, const HostBuffer& counts,
                       const std::vector<uint64_t>& tokens, uint64_t budget,
                       const std::vector<MemoryBuffer>& buffers, Result& result,
                       const std::string& prefix) {
  std::vector<uint64_t> tickets;
  uint64_t payload = 0;
  uint64_t pages = 0;
  // Counts live in shared memory and are read by the daemon when the copy runs (sync-free).
  for (size_t l = 0; l < tokens.size(); ++l) {
    const auto count = static_cast<int64_t>(tokens[l]);
    std::memcpy(counts.data() + 8 * l, &count, 8);
  }
  for (size_t l = 0; l < tokens.size(); ++l) {
    for (const MemoryBuffer& b : buffers) {
      StashArgs args;
      args.source = &source;
      args.row_bytes = b.row_bytes;
      args.max_rows = budget / b.divisor;
      args.count.buffer = &counts;
      args.count.offset = 8 * l;
      args.count.divisor = b.divisor;
      STASH_ASSIGN_OR_RETURN(const Completion done, StashAndWait(client, args));
      const uint64_t want = tokens[l] / b.divisor * b.row_bytes;
      STASH_RETURN_IF_ERROR(CheckPlaced(done, want));
      payload += done.bytes;
      pages += done.pages;
      tickets.push_back(done.ticket);
    }
  }
  STASH_ASSIGN_OR_RETURN(const SessionStats at_peak, client.Stats());
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
    STASH_ASSIGN_OR_RETURN(const Completion unused, ReloadAndWait(client, *it, source));
    (void)unused;
  }
  STASH_ASSIGN_OR_RETURN(const SessionStats after, client.Stats());
  if (after.pool_pages_used != 0) {
    return InternalError("pages still in use after every reload: " +
                         std::to_string(after.pool_pages_used));
  }
  result.Add(prefix + "_high_water_pages", static_cast<double>(at_peak.pool_pages_high_water))
      .Add(prefix + "_pages_at_peak", static_cast<double>(at_peak.pool_pages_used))
      .Add(prefix + "_stash_pages", static_cast<double>(pages))
      .Add(prefix + "_payload_bytes", static_cast<double>(payload));
  return Status::Ok();
}

}  // namespace

Status RunMemory(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t budget = FlagU64(flags, "budget", 49152);
  const uint64_t hidden = FlagU64(flags, "hidden", 7168);
  std::vector<uint64_t> tokens;
  {
    std::istringstream in(Flag(flags, "tokens"));
    std::string item;
    while (std::getline(in, item, ',')) tokens.push_back(std::stoull(item));
  }
  if (tokens.empty()) return InvalidArgumentError("--tokens=t0,t1,... is required");
  const uint64_t scale_row = (hidden + 127) / 128 * 128;
  STASH_ASSIGN_OR_RETURN(auto bf16, OpenClient(socket, ClientConfig(), 0));
  STASH_ASSIGN_OR_RETURN(auto mxfp8, OpenClient(socket, ClientConfig(), 1));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(budget * 2 * hidden));
  STASH_ASSIGN_OR_RETURN(auto counts, HostBuffer::Allocate(8 * tokens.size()));
  Result result;
  STASH_RETURN_IF_ERROR(
      RunMemoryOnPool(*bf16, *source, *counts, tokens, budget, {{2 * hidden, 1}}, result, "bf16"));
  STASH_RETURN_IF_ERROR(RunMemoryOnPool(*mxfp8, *source, *counts, tokens, budget,
                                        {{hidden, 1}, {scale_row, 32}}, result, "mxfp8"));
  result.Print();
  return Status::Ok();
}

// --task=blocked: queues --requests stashes whose ready event nobody signals (the daemon holds
// them all), prints "ready", and holds them until its stdin closes or it is killed.
Status RunBlocked(const Flags& flags) {
  const uint64_t requests = FlagU64(flags, "requests", 4095);
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(Flag(flags, "socket")));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(4096));
  STASH_ASSIGN_OR_RETURN(auto events, HostBuffer::Allocate(4096));
  StashArgs args;
  args.source = source.get();
  args.row_bytes = 64;
  args.max_rows = 64;
  args.count.value = 64;
  // One answered stash first: both buffers are registered before the held ones queue, so all
  // --requests of them fit under the daemon's in-flight limit.
  args.ready = {events.get(), 0, 0};
  STASH_ASSIGN_OR_RETURN(const Completion first, StashAndWait(*client, args));
  STASH_RETURN_IF_ERROR(CheckPlaced(first, 4096));
  args.ready = {events.get(), 8, 1};  // never signalled
  for (uint64_t i = 0; i < requests; ++i) {
    STASH_RETURN_IF_ERROR(client->Stash(args).status());
  }
  // Ready once the daemon holds them all (Stash returns before the request is even written).
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + Flag(flags, "socket"), grpc::InsecureChannelCredentials()));
  for (bool held = false; !held; usleep(10000)) {
    grpc::ClientContext context;
    v1::GetStatsResponse stats;
    const grpc::Status s = stub->GetStats(&context, v1::GetStatsRequest(), &stats);
    if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
    for (const v1::SessionStats& row : stats.sessions()) {
      held |= row.session_id() == client->session_id() && row.requests_inflight() >= requests;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
  }
  return Status::Ok();
}

// --task=roundtrip: --iters 4 KiB Stash+Wait then Reload+Wait; reports the Stash+Wait median.
Status RunRoundTrip(const Flags& flags) {
  const uint64_t iters = FlagU64(flags, "iters", 2000);
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(Flag(flags, "socket")));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(4096));
  STASH_ASSIGN_OR_RETURN(auto destination, HostBuffer::Allocate(4096));
  StashArgs args;
  args.source = source.get();
  args.row_bytes = 64;
  args.max_rows = 64;
  args.count.value = 64;
  std::vector<double> samples;
  for (uint64_t i = 0; i < iters + iters / 10; ++i) {  // the first tenth warms up
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion done, StashAndWait(*client, args));
    const auto t1 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(done, 4096));
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, done.ticket, *destination).status());
    if (i >= iters / 10) samples.push_back(MicrosBetween(t0, t1));
  }
  Result result;
  result.Add("stash_median_us", Median(samples))
      .Add("stash_p99_us", Quantile(samples, 0.99))
      .Add("samples", static_cast<double>(samples.size()));
  result.Print();
  return Status::Ok();
}

}  // namespace stash::bench

// --task=saturate and --task=throughput: workers that load the daemon for the time "go" names
// (bench/worker.h).
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

// ---- saturate -------------------------------------------------------------------------------

namespace {

// Reads "go <milliseconds>" from stdin (after printing "ready").
StatusOr<double> AwaitGo() {
  std::printf("ready\n");
  std::fflush(stdout);
  std::string word;
  double ms = 0;
  if (!(std::cin >> word >> ms) || word != "go")
    return UnavailableError("stdin closed before \"go\"");
  return ms / 1000.0;
}

}  // namespace

Status RunSaturateStash(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t window = FlagU64(flags, "window", 32);
  constexpr uint64_t kBytes = 4096;
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 64ULL << 20));
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(kBytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(kBytes));
  StashArgs args;
  args.source = src.get();
  args.row_bytes = kBytes;
  args.max_rows = 1;
  args.count.value = 1;

  struct InFlight {
    uint64_t op;
    bool is_stash;
  };
  std::deque<InFlight> queue;
  uint64_t issued = 0;  // every request sent, warm-up and drain included
  // Answers of one session come back in order, so waiting on the oldest keeps `window` busy.
  auto step = [&]() -> Status {
    const InFlight front = queue.front();
    queue.pop_front();
    STASH_ASSIGN_OR_RETURN(const Completion done, client->Wait(front.op));
    if (front.is_stash) {
      STASH_RETURN_IF_ERROR(CheckPlaced(done, kBytes));
      ReloadArgs r;
      r.ticket = front.op;
      r.destination = dst.get();
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Reload(r));
      ++issued;
      queue.push_back({op, false});
    } else {
      STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
      ++issued;
      queue.push_back({ticket, true});
    }
    return Status::Ok();
  };
  for (uint64_t i = 0; i < window; ++i) {
    STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
    ++issued;
    queue.push_back({ticket, true});
  }
  for (int i = 0; i < 500; ++i) STASH_RETURN_IF_ERROR(step());  // warm-up

  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t done = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_RETURN_IF_ERROR(step());
    ++done;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  while (!queue.empty()) {  // drain: every stash is reloaded or released before leaving
    const InFlight front = queue.front();
    queue.pop_front();
    STASH_ASSIGN_OR_RETURN(const Completion c, client->Wait(front.op));
    if (front.is_stash) {
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Release(c.ticket));
      ++issued;
      STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
      (void)unused;
    }
  }
  Result()
      .Add("ops", static_cast<double>(done))
      .Add("seconds", elapsed)
      .Add("issued", static_cast<double>(issued))
      .Print();
  return Status::Ok();
}

// Unary pings, `window` in flight through the callback API.
Status RunSaturatePing(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t window = FlagU64(flags, "window", 32);
  STASH_ASSIGN_OR_RETURN(auto channel, ConnectUnix(socket, kConnectMs));
  auto stub = pb::Ping::NewStub(channel);

  struct Slot {
    std::unique_ptr<grpc::ClientContext> context;
    pb::PingMessage request, reply;
  };
  std::vector<Slot> slots(window);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<size_t> finished;  // guarded by mu
  bool failed = false;           // guarded by mu
  uint64_t issued = 0;           // every call made, warm-up and drain included
  auto issue = [&](size_t i) {
    ++issued;
    Slot& s = slots[i];
    s.context = std::make_unique<grpc::ClientContext>();
    s.request.set_id(i);
    stub->async()->Echo(s.context.get(), &s.request, &s.reply, [&, i](const grpc::Status& status) {
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok()) failed = true;
      finished.push_back(i);
      cv.notify_one();
    });
  };
  // Waits for finished calls, reissues them while `more`; returns how many finished.
  auto turn = [&](bool more) -> StatusOr<uint64_t> {
    std::vector<size_t> ready;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !finished.empty(); });
      if (failed) return UnavailableError("ping failed");
      ready.swap(finished);
    }
    if (more) {
      for (size_t i : ready) issue(i);
    }
    return ready.size();
  };
  for (size_t i = 0; i < window; ++i) issue(i);
  for (uint64_t warm = 0; warm < 500;) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(true));
    warm += n;
  }
  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t done = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(true));
    done += n;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  for (uint64_t left = window; left > 0;) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(false));
    left -= n;
  }
  Result()
      .Add("ops", static_cast<double>(done))
      .Add("seconds", elapsed)
      .Add("issued", static_cast<double>(issued))
      .Print();
  return Status::Ok();
}

// ---- throughput (the clients phase) ---------------------------------------------------------

// --task=throughput: Stash+Wait then Reload+Wait of one --bytes buffer, over and over for the
// time "go" names (several of these run at once, one per process); reports the bytes copied in
// and out. The reloaded bytes are checked against the source after the timed loop.
Status RunThroughput(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t bytes = FlagU64(flags, "bytes", 16ULL << 20);
  constexpr uint64_t kRowBytes = 4096;
  if (bytes % kRowBytes != 0) return InvalidArgumentError("--bytes must be a multiple of 4096");
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 2 * bytes));
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(bytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(bytes));
  const uint64_t salt = static_cast<uint64_t>(getpid()) << 32;  // each process its own bytes
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = (i ^ salt) * 0x9E3779B97F4A7C15ULL;
    std::memcpy(src->data() + i, &v, 8);
  }
  std::memset(dst->data(), 0, bytes);
  STASH_ASSIGN_OR_RETURN(auto stub, DaemonStub(socket));
  STASH_RETURN_IF_ERROR(CheckMode(*stub, *client, config.mode));

  StashArgs args;
  args.source = src.get();
  args.row_bytes = kRowBytes;
  args.max_rows = bytes / kRowBytes;
  args.count.value = args.max_rows;
  auto cycle = [&]() -> Status {
    STASH_ASSIGN_OR_RETURN(const Completion s, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(s, bytes));
    STASH_ASSIGN_OR_RETURN(const Completion r, ReloadAndWait(*client, s.ticket, *dst));
    if (r.bytes != bytes) {
      return InternalError("reload copied " + std::to_string(r.bytes) + " bytes, not " +
                           std::to_string(bytes));
    }
    return Status::Ok();
  };
  // Warm-up as in the copy task: two stashes held at once touch every page of the (pool share or
  // lease) the bench sized to two buffers, then both reloads.
  {
    STASH_ASSIGN_OR_RETURN(const Completion a, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(a, bytes));
    STASH_ASSIGN_OR_RETURN(const Completion b, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(b, bytes));
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, a.ticket, *dst).status());
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, b.ticket, *dst).status());
  }
  STASH_RETURN_IF_ERROR(cycle());

  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t cycles = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_RETURN_IF_ERROR(cycle());
    ++cycles;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  std::memset(dst->data(), 0, bytes);
  STASH_RETURN_IF_ERROR(cycle());
  if (std::memcmp(dst->data(), src->data(), bytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones");
  }
  Result()
      .Add("cycles", static_cast<double>(cycles))
      .Add("seconds", elapsed)
      .Add("bytes_moved", static_cast<double>(2 * bytes * cycles))  // stashed in + reloaded out
      .Add("verified", 1)
      .Print();
  return Status::Ok();
}

}  // namespace stash::bench

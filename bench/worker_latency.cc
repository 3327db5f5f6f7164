// --task=latency: the latency phase's worker (bench/worker.h).
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

// ---- latency --------------------------------------------------------------------------------

Status RunLatency(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const std::string ping_socket = Flag(flags, "ping-socket");
  const uint64_t iters = FlagU64(flags, "iters", 2000);
  const uint64_t rounds = FlagU64(flags, "rounds", 40);
  const uint64_t warmup = FlagU64(flags, "warmup", 300);
  constexpr uint64_t kBytes = 4096;
  // Mapped mode: 16 MiB leased holds a burst of 8 stashes at any page size up to 1 MiB.
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 16ULL << 20));

  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(kBytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(kBytes));
  std::memset(src->data(), 0x5A, kBytes);
  STASH_ASSIGN_OR_RETURN(auto ping_channel, ConnectUnix(ping_socket, kConnectMs));
  auto ping = pb::Ping::NewStub(ping_channel);
  auto pinger = std::make_unique<StreamPinger>(ping.get());
  STASH_ASSIGN_OR_RETURN(auto daemon, DaemonStub(socket));
  STASH_RETURN_IF_ERROR(CheckMode(*daemon, *client, config.mode));

  StashArgs args;
  args.source = src.get();
  args.row_bytes = kBytes;
  args.max_rows = 1;
  args.count.value = 1;

  std::vector<double> submit_us, stash_us, reload_submit_us, reload_us, daemon_stash_us;
  std::vector<double> ping_us, stream_us, getstats_us;
  uint64_t ping_id = 0;

  auto unary_ping = [&](std::vector<double>* out) -> Status {
    grpc::ClientContext context;
    pb::PingMessage request, reply;
    request.set_id(++ping_id);
    const auto t0 = Clock::now();
    const grpc::Status s = ping->Echo(&context, request, &reply);
    const auto t1 = Clock::now();
    if (!s.ok()) return UnavailableError("ping: " + s.error_message());
    if (out != nullptr) out->push_back(MicrosBetween(t0, t1));
    return Status::Ok();
  };
  auto stream_ping = [&](std::vector<double>* out) -> Status {
    const auto t0 = Clock::now();
    if (!pinger->Ping(++ping_id)) return UnavailableError("stream ping broke");
    if (out != nullptr) out->push_back(MicrosBetween(t0, Clock::now()));
    return Status::Ok();
  };
  auto get_stats = [&](std::vector<double>* out) -> Status {
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const v1::DaemonStats unused, GetDaemonStats(*daemon));
    (void)unused;
    if (out != nullptr) out->push_back(MicrosBetween(t0, Clock::now()));
    return Status::Ok();
  };
  auto stash_once = [&](bool record) -> Status {
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
    const auto t1 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion s, client->Wait(ticket));
    const auto t2 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
    ReloadArgs r;
    r.ticket = ticket;
    r.destination = dst.get();
    const auto t3 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Reload(r));
    const auto t4 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
    const auto t5 = Clock::now();
    (void)unused;
    if (record) {
      submit_us.push_back(MicrosBetween(t0, t1));
      stash_us.push_back(MicrosBetween(t0, t2));
      reload_submit_us.push_back(MicrosBetween(t3, t4));
      reload_us.push_back(MicrosBetween(t3, t5));
      daemon_stash_us.push_back(static_cast<double>(s.latency_us));
    }
    return Status::Ok();
  };

  // The one-call forms (StashAndWait, ReloadAndWait: the Python binding's wait=True).
  std::vector<double> sync_stash_us, sync_reload_us;
  auto sync_once = [&](bool record) -> Status {
    const auto t0 = Clock::now();
    uint64_t ticket = 0;
    STASH_ASSIGN_OR_RETURN(const Completion s, client->StashAndWait(args, -1, &ticket));
    const auto t1 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
    ReloadArgs r;
    r.ticket = ticket;
    r.destination = dst.get();
    const auto t2 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion unused, client->ReloadAndWait(r));
    const auto t3 = Clock::now();
    (void)unused;
    if (record) {
      sync_stash_us.push_back(MicrosBetween(t0, t1));
      sync_reload_us.push_back(MicrosBetween(t2, t3));
    }
    return Status::Ok();
  };

  // Eight Stash() calls back to back (a layer's buffers): after the first, a write is usually in
  // flight, so the call only queues.
  std::vector<double> burst_submit_us;
  auto stash_burst = [&](bool record) -> Status {
    constexpr int kBurst = 8;
    uint64_t tickets[kBurst];
    for (uint64_t& ticket : tickets) {
      const auto t0 = Clock::now();
      STASH_ASSIGN_OR_RETURN(ticket, client->Stash(args));
      if (record) burst_submit_us.push_back(MicrosBetween(t0, Clock::now()));
    }
    for (uint64_t ticket : tickets) {
      STASH_ASSIGN_OR_RETURN(const Completion s, client->Wait(ticket));
      STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Release(ticket));
      STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
      (void)unused;
    }
    return Status::Ok();
  };

  for (uint64_t i = 0; i < warmup; ++i) {
    STASH_RETURN_IF_ERROR(unary_ping(nullptr));
    STASH_RETURN_IF_ERROR(stream_ping(nullptr));
    STASH_RETURN_IF_ERROR(stash_once(false));
    STASH_RETURN_IF_ERROR(sync_once(false));
  }
  STASH_RETURN_IF_ERROR(get_stats(nullptr));
  // Rounds interleave the kinds, so a noisy moment of the machine hits all of them alike.
  const uint64_t per_round = (iters + rounds - 1) / rounds;
  for (uint64_t round = 0; round < rounds; ++round) {
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(unary_ping(&ping_us));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(stash_once(true));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(sync_once(true));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(stream_ping(&stream_us));
    for (uint64_t i = 0; i < per_round / 4; ++i) STASH_RETURN_IF_ERROR(get_stats(&getstats_us));
    for (uint64_t i = 0; i < per_round / 8; ++i) STASH_RETURN_IF_ERROR(stash_burst(true));
  }
  if (std::memcmp(dst->data(), src->data(), kBytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones");
  }
  // Every recorded reload went to `dst`: the last one is checked above, one more with fresh
  // bytes checks the path once more after the timed rounds.
  std::memset(src->data(), 0xA5, kBytes);
  std::memset(dst->data(), 0, kBytes);
  STASH_RETURN_IF_ERROR(stash_once(false));
  if (std::memcmp(dst->data(), src->data(), kBytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones (after the rounds)");
  }
  pinger.reset();
  Result()
      .Add("submit_median_us", Median(submit_us))
      .Add("submit_p99_us", Quantile(submit_us, 0.99))
      .Add("stash_median_us", Median(stash_us))
      .Add("stash_p99_us", Quantile(stash_us, 0.99))
      .Add("sync_stash_median_us", Median(sync_stash_us))
      .Add("sync_stash_p99_us", Quantile(sync_stash_us, 0.99))
      .Add("sync_reload_median_us", Median(sync_reload_us))
      .Add("burst_submit_median_us", Median(burst_submit_us))
      .Add("burst_submit_p99_us", Quantile(burst_submit_us, 0.99))
      .Add("reload_submit_median_us", Median(reload_submit_us))
      .Add("reload_median_us", Median(reload_us))
      .Add("reload_p99_us", Quantile(reload_us, 0.99))
      .Add("daemon_stash_median_us", Median(daemon_stash_us))
      .Add("ping_median_us", Median(ping_us))
      .Add("ping_p99_us", Quantile(ping_us, 0.99))
      .Add("stream_median_us", Median(stream_us))
      .Add("stream_p99_us", Quantile(stream_us, 0.99))
      .Add("getstats_median_us", Median(getstats_us))
      .Add("getstats_p99_us", Quantile(getstats_us, 0.99))
      .Add("ping_p10_us", Quantile(ping_us, 0.1))
      .Add("ping_p90_us", Quantile(ping_us, 0.9))
      .Add("stash_p10_us", Quantile(stash_us, 0.1))
      .Add("stash_p90_us", Quantile(stash_us, 0.9))
      .Add("stream_p10_us", Quantile(stream_us, 0.1))
      .Add("stream_p90_us", Quantile(stream_us, 0.9))
      .Add("samples", static_cast<double>(stash_us.size()))
      .Print();
  return Status::Ok();
}

}  // namespace stash::bench

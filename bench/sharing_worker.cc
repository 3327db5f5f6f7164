#include "bench/sharing_worker.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/macros.h"
#include "stash/client.h"

namespace stash::bench {
namespace {

using Flags = std::map<std::string, std::string>;

uint64_t FlagU64(const Flags& flags, const std::string& name, uint64_t fallback) {
  auto it = flags.find(name);
  return it == flags.end() || it->second.empty() ? fallback : std::stoull(it->second);
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

struct Counts {
  uint64_t stashes = 0, overflows = 0, spills = 0;
  uint64_t peers = 0;  // placed in another device's pool (TIER_PEER): shared, not spilled
};

class Rank {
 public:
  Rank(std::unique_ptr<Client> client, std::unique_ptr<HostBuffer> source,
       std::unique_ptr<HostBuffer> destination, uint64_t row_bytes, uint64_t max_rows,
       uint64_t warmup)
      : client_(std::move(client)),
        source_(std::move(source)),
        destination_(std::move(destination)),
        row_bytes_(row_bytes),
        max_rows_(max_rows),
        warmup_(warmup) {}

  Status BeginStep(uint64_t step) {
    step_ = step;
    STASH_ASSIGN_OR_RETURN(const uint64_t op, client_->BeginStep(step));
    STASH_RETURN_IF_ERROR(client_->Wait(op).status());
    if (step >= warmup_) {
      // Mapped: what the leases hold once this rank's lease is sized for the step.
      STASH_ASSIGN_OR_RETURN(const SessionStats stats, client_->Stats());
      pool_used_max_ = std::max(pool_used_max_, stats.pool_pages_used);
    }
    return Status::Ok();
  }

  // "s<slot>:<rows>" and "r<slot>" words.
  Status Run(std::istringstream& words) {
    struct Pending {
      uint64_t op;
      bool reload;
      uint64_t slot;
      uint64_t rows;
    };
    std::vector<Pending> pending;
    for (std::string w; words >> w;) {
      if (w.size() < 2 || (w[0] != 's' && w[0] != 'r')) {
        return InvalidArgumentError("bad operation '" + w + "'");
      }
      if (w[0] == 's') {
        const size_t colon = w.find(':');
        if (colon == std::string::npos) return InvalidArgumentError("bad stash '" + w + "'");
        const uint64_t slot = std::stoull(w.substr(1, colon - 1));
        const uint64_t rows = std::stoull(w.substr(colon + 1));
        if (rows > max_rows_) return InvalidArgumentError("stash of more rows than --max-rows");
        StashArgs args;
        args.source = source_.get();
        args.row_bytes = row_bytes_;
        args.max_rows = max_rows_;
        args.count.value = rows;
        args.layer = static_cast<uint32_t>(slot);
        STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client_->Stash(args));
        pending.push_back({ticket, false, slot, rows});
      } else {
        const uint64_t slot = std::stoull(w.substr(1));
        auto it = tickets_.find(slot);
        if (it == tickets_.end()) continue;  // it overflowed: nothing to reload
        ReloadArgs args;
        args.ticket = it->second.first;
        args.destination = destination_.get();
        STASH_ASSIGN_OR_RETURN(const uint64_t op, client_->Reload(args));
        pending.push_back({op, true, slot, it->second.second});
        tickets_.erase(it);
      }
    }
    for (const Pending& p : pending) {
      STASH_ASSIGN_OR_RETURN(const Completion done, client_->Wait(p.op));
      if (p.reload) {
        // The source holds the same bytes for every stash: the first rows must match.
        if (std::memcmp(destination_->data(), source_->data(), p.rows * row_bytes_) != 0) {
          return InternalError("stash " + std::to_string(p.slot) + " reloaded other bytes");
        }
        continue;
      }
      const bool counted = step_ >= warmup_;
      if (counted) ++counts_.stashes;
      if (done.tier == Tier::kOverflow) {
        if (counted) ++counts_.overflows;
        continue;
      }
      if (done.tier == Tier::kHost && counted) ++counts_.spills;
      if (done.tier == Tier::kPeer && counted) ++counts_.peers;
      tickets_[p.slot] = {done.ticket, p.rows};
    }
    return Status::Ok();
  }

  Status Report() {
    STASH_ASSIGN_OR_RETURN(const SessionStats stats, client_->Stats());
    std::ostringstream out;
    out << "result stashes=" << counts_.stashes << " overflows=" << counts_.overflows
        << " spills=" << counts_.spills << " peers=" << counts_.peers
        << " pool_high_water=" << stats.pool_pages_high_water
        << " host_high_water=" << stats.host_pages_high_water
        << " pool_used_at_step_max=" << pool_used_max_ << " pages_leftover=" << stats.pages_live
        << " stashes_left=" << tickets_.size();
    Say(out.str());
    return Status::Ok();
  }

 private:
  std::unique_ptr<Client> client_;
  std::unique_ptr<HostBuffer> source_, destination_;
  uint64_t row_bytes_, max_rows_, warmup_;
  uint64_t step_ = 0;
  uint64_t pool_used_max_ = 0;  // pages of the pool in use right after a counted BeginStep
  Counts counts_;
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> tickets_;  // slot: ticket, rows
};

Status Serve(const Flags& flags) {
  Options options;
  auto it = flags.find("socket");
  options.socket = it == flags.end() ? "" : it->second;
  options.device = static_cast<int>(FlagU64(flags, "device", 0));
  options.rank = static_cast<int64_t>(FlagU64(flags, "rank", 0));
  options.label = "stash-bench rank";
  options.connect_timeout_ms = 10000;
  options.allow_host_spill = true;
  const std::string mode = flags.count("mode") ? flags.at("mode") : "daemon-copy";
  if (mode == "mapped" || mode == "mapped-group") {
    options.mode = Mode::kMapped;  // automatic lease: sized by the daemon at each BeginStep
  } else if (mode != "daemon-copy") {
    return InvalidArgumentError("--mode=" + mode + ": use daemon-copy, mapped or mapped-group");
  }
  if (mode == "mapped-group") {
    // The node's 8 ranks as one job's group (docs/design.md, "Groups"); the secret is the
    // bench's own, as a launcher would share one.
    options.group = "stash-bench-sharing";
    options.group_secret = std::string(32, 'b');
  }
  const uint64_t row_bytes = FlagU64(flags, "row-bytes", 0);
  const uint64_t max_rows = FlagU64(flags, "max-rows", 0);
  if (row_bytes == 0 || max_rows == 0) {
    return InvalidArgumentError("--row-bytes and --max-rows are required (> 0)");
  }
  STASH_ASSIGN_OR_RETURN(auto client, Client::Open(options));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(row_bytes * max_rows));
  STASH_ASSIGN_OR_RETURN(auto destination, HostBuffer::Allocate(row_bytes * max_rows));
  for (uint64_t i = 0; i < row_bytes * max_rows; ++i) {
    source->data()[i] = static_cast<uint8_t>(i * 131 + options.rank);
  }
  Rank rank(std::move(client), std::move(source), std::move(destination), row_bytes, max_rows,
            FlagU64(flags, "warmup", 0));
  Say("ready");
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream words(line);
    std::string verb;
    words >> verb;
    if (verb == "b") {
      uint64_t step = 0;
      words >> step;
      STASH_RETURN_IF_ERROR(rank.BeginStep(step));
    } else if (verb == "o") {
      STASH_RETURN_IF_ERROR(rank.Run(words));
    } else if (verb == "end") {
      return rank.Report();
    } else {
      return InvalidArgumentError("unknown line '" + line + "'");
    }
    Say("ok");
  }
  return InvalidArgumentError("stdin closed before 'end'");
}

}  // namespace

int RunRankWorker(const Flags& flags) {
  const Status status = Serve(flags);
  if (status.ok()) return 0;
  std::printf("error %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace stash::bench

#include "examples/rank.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#if STASH_DEMO_CUDA
#include "examples/cuda_trainer.h"
#endif
#include "examples/daemon_store.h"
#include "examples/expert_stack.h"
#include "examples/report.h"
#include "examples/routing.h"
#include "stash/client.h"

namespace stash::demo {
namespace {

const char* YesNo(bool b) { return b ? "yes" : "no"; }

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * fraction);
  return buf;
}

// The daemon's step flags must agree with the tiers its own answers named.
Status CheckStepFlags(const char* when, bool overflow, bool spilled, const StashTally& tally) {
  if (overflow == (tally.overflow > 0) && spilled == (tally.host > 0)) return Status::Ok();
  return InternalError(std::string(when) + " says overflow=" + YesNo(overflow) +
                       " spilled=" + YesNo(spilled) + ", but the step's stashes went " +
                       std::to_string(tally.host) + " to the host tier and " +
                       std::to_string(tally.overflow) + " to overflow");
}

class Rank {
 public:
  Rank(const DemoFlags& flags, int rank, int report_fd, int hold_fd)
      : flags_(flags), rank_(rank), report_(report_fd), hold_fd_(hold_fd) {
    shape_.max_tokens = TokenBudget(flags.tokens, flags.topk, flags.capacity_factor);
    shape_.hidden = flags.hidden;
    shape_.experts = flags.experts;
    shape_.layers = flags.layers;
  }

  int Run() {
    Status status = RunSteps();
    if (parity_failed_) return 1;
    if (!status.ok()) {
      report_.Write(kErrorLine, {status.ToString()});
      return 1;
    }
    report_.Write(kTotalsLine, EncodeTotals(totals_));
    return 0;
  }

 private:
  Status RunSteps() {
    Options options;
    options.socket = flags_.socket;
    options.device = rank_ % flags_.devices;
    options.rank = rank_;
    options.label = "stash-demo";
    options.backend = flags_.backend == "cuda" ? Backend::kCuda : Backend::kHost;
    options.mode = flags_.mode == "mapped" ? Mode::kMapped : Mode::kDaemonCopy;
    options.lease.automatic = flags_.lease_automatic;
    options.lease.device_bytes = flags_.lease_device_bytes;
    options.lease.peer_bytes = flags_.lease_peer_bytes;
    options.lease.host_bytes = flags_.lease_host_bytes;
    StatusOr<std::unique_ptr<Client>> client = Client::Open(options);
    if (!client.ok()) return client.status();
    client_ = std::move(client).value();
    report_.Write(kOpenLine, {client_->socket(), std::to_string(client_->page_bytes()),
                              std::to_string(client_->pool_pages()),
                              std::to_string(client_->host_tier_pages())});

    weights_ = MakeWeights(shape_, flags_.seed);
#if STASH_DEMO_CUDA
    if (options.backend == Backend::kCuda) {
      StatusOr<std::unique_ptr<CudaTrainer>> trainer =
          CudaTrainer::Create(client_.get(), options.device, shape_, weights_);
      if (!trainer.ok()) return Prefixed(-1, trainer.status());
      trainer_ = std::move(trainer).value();
    }
#endif
    if (options.backend == Backend::kHost) {
      StatusOr<std::unique_ptr<DaemonStore>> store = DaemonStore::Create(client_.get(), shape_);
      if (!store.ok()) return Prefixed(-1, store.status());
      store_ = std::move(store).value();
    }

    StashTally previous;
    for (int step = 0; step < flags_.steps; ++step) {
      if (Status s = RunStep(step, &previous); !s.ok()) return s;
      if (parity_failed_) return Status::Ok();
    }

    // Every stash was reloaded: the session must hold nothing now.
    StatusOr<SessionStats> stats = client_->Stats();
    if (!stats.ok() && stats.status().code() == StatusCode::kUnavailable) {
      // stashd drained (SIGTERM, stashctl drain) or stopped after the last reload: this rank's
      // session ended once its last stash was back (every reload above succeeded), so there is
      // no session left to ask, and it held nothing.
      return Status::Ok();
    }
    if (!stats.ok()) return Prefixed(-1, stats.status());
    if (stats->stashes_live != 0 || stats->pages_live != 0) {
      return Prefixed(
          -1, InternalError("the daemon still holds " + std::to_string(stats->stashes_live) +
                            " stashes (" + std::to_string(stats->pages_live) +
                            " pages) of this session after every reload"));
    }
    totals_.spills = stats->spills;
    totals_.overflows = stats->overflows;
    return Status::Ok();
  }

  Status RunStep(int step, StashTally* previous) {
    // BeginStep answers the previous step's flags; they must match that step's answers.
    StatusOr<uint64_t> begin = client_->BeginStep(static_cast<uint64_t>(step));
    if (!begin.ok()) return Prefixed(step, begin.status());
    StatusOr<Completion> begun = client_->Wait(*begin, kAnswerTimeoutMs);
    if (!begun.ok()) return Prefixed(step, begun.status());
    if (Status s = CheckStepFlags("BeginStep's flags of the previous step", begun->step_overflow,
                                  begun->step_spilled, *previous);
        !s.ok()) {
      return Prefixed(step, s);
    }

    const uint64_t seed =
        MixSeed(flags_.seed, static_cast<uint64_t>(rank_), static_cast<uint64_t>(step));
    const StepInputs inputs = MakeStepInputs(shape_, flags_.tokens, flags_.topk, seed);

    // The reference: the same step with every activation kept in this process.
    StepOutputs want;
    {
      InProcessStore kept(shape_);
      if (Status s = StackForward(shape_, weights_, inputs, kept, &want); !s.ok()) {
        return Prefixed(step, s);
      }
      if (Status s = StackBackward(shape_, weights_, inputs, kept, &want); !s.ok()) {
        return Prefixed(step, s);
      }
    }

    // The stashed run.
    StepOutputs got;
    if (Status s = StashedForward(inputs, &got); !s.ok()) return Prefixed(step, s);
    // The peak: every layer's input is stashed (or kept after an overflow).
    StatusOr<SessionStats> stats = client_->Stats();
    if (!stats.ok()) return Prefixed(step, stats.status());
    const StepFlags now = client_->CurrentStepFlags();
    const StashTally tally = Tally();
    if (Status s = CheckStepFlags("CurrentStepFlags", now.overflow, now.spilled, tally); !s.ok()) {
      return Prefixed(step, s);
    }
    if (step + 1 == flags_.steps && hold_fd_ >= 0) {
      if (Status s = Hold(); !s.ok()) return Prefixed(step, s);
    }
    if (Status s = StashedBackward(inputs, &got); !s.ok()) return Prefixed(step, s);

    // Worst case: every layer's input kept at the static budget, as without paging.
    const uint64_t worst = static_cast<uint64_t>(shape_.layers) * shape_.ActivationBytes();
    const uint64_t held = tally.bytes + tally.kept_bytes;
    const auto n = [](auto v) { return std::to_string(v); };
    std::string line =
        "step " + n(step) + " rank " + n(rank_) + " (device " + n(rank_ % flags_.devices) + ")";
    line += " | previous step overflow=" + std::string(YesNo(begun->step_overflow)) +
            " spilled=" + YesNo(begun->step_spilled);
    line += " | rows " + n(inputs.routing.rows()) + "/" + n(shape_.max_tokens) + ", dropped " +
            n(inputs.routing.dropped);
    line += " | tiers: device " + n(tally.device) + ", host " + n(tally.host) + ", overflow " +
            n(tally.overflow);
    line += " | stashd holds " + FormatBytes(tally.bytes) + " in " + n(tally.pages) +
            " pages (pool " + n(stats->pool_pages_used) + " used, high water " +
            n(stats->pool_pages_high_water) + "/" + n(stats->pool_pages_total) +
            "; host high water " + n(stats->host_pages_high_water) + "/" +
            n(stats->host_pages_total) + ")";
    line += " | session spills=" + n(stats->spills) + " overflows=" + n(stats->overflows);
    line += " | vs worst case " + FormatBytes(worst);
    if (tally.kept_bytes > 0) line += " (+" + FormatBytes(tally.kept_bytes) + " kept in rank)";
    line += ": " + Percent(1.0 - static_cast<double>(held) / static_cast<double>(worst)) +
            " memory saved";
    report_.Write(kStepLine, {std::to_string(step), line});

    totals_.device += static_cast<uint64_t>(tally.device);
    totals_.host += static_cast<uint64_t>(tally.host);
    totals_.overflow += static_cast<uint64_t>(tally.overflow);
    totals_.bytes += tally.bytes;
    totals_.kept_bytes += tally.kept_bytes;
    totals_.worst_bytes += worst;
    totals_.dropped += static_cast<uint64_t>(inputs.routing.dropped);
    totals_.assignments += static_cast<uint64_t>(inputs.routing.assignments);
    *previous = tally;

    if (std::optional<Mismatch> m = FirstMismatch(shape_, want, got)) {
      report_.Write(kParityLine, {"parity: FAILED on rank " + std::to_string(rank_) + ", step " +
                                  std::to_string(step) + ", layer " + std::to_string(m->layer) +
                                  ": " + m->what});
      parity_failed_ = true;
    }
    return Status::Ok();
  }

  // The stashed run's passes: on the GPU (--backend=cuda) or on the CPU with shared memory.
  Status StashedForward(const StepInputs& inputs, StepOutputs* got) {
#if STASH_DEMO_CUDA
    if (trainer_ != nullptr) {
      trainer_->BeginStep();
      return trainer_->Forward(inputs, got);
    }
#endif
    store_->BeginStep();
    return StackForward(shape_, weights_, inputs, *store_, got);
  }
  Status StashedBackward(const StepInputs& inputs, StepOutputs* got) {
#if STASH_DEMO_CUDA
    if (trainer_ != nullptr) return trainer_->Backward(inputs, got);
#endif
    return StackBackward(shape_, weights_, inputs, *store_, got);
  }
  StashTally Tally() const {
#if STASH_DEMO_CUDA
    if (trainer_ != nullptr) return trainer_->tally();
#endif
    return store_->tally();
  }

  // Tells the launcher this rank holds its last step's stashes, then waits for its byte.
  Status Hold() {
    report_.Write(kHoldLine, {});
    char byte = 0;
    while (true) {
      const ssize_t n = ::read(hold_fd_, &byte, 1);
      if (n == 1) return Status::Ok();
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return InternalError(std::string("cannot read the hold pipe: ") + std::strerror(errno));
      // End of file without the byte: the launcher died (it always writes before closing). Its
      // death signal (PR_SET_PDEATHSIG, SIGTERM) is on its way and ends this process; going on
      // would train and report to nobody.
      while (true) ::pause();
    }
  }

  // "step 1: <message>"; step -1 = before the first step. The launcher names the rank.
  static Status Prefixed(int step, const Status& status) {
    if (step < 0) return status;
    return Status(status.code(), "step " + std::to_string(step) + ": " + status.message());
  }

  const DemoFlags flags_;
  const int rank_;
  ReportWriter report_;
  const int hold_fd_;  // -1 = no hold; not owned
  StackShape shape_;
  std::vector<std::vector<float>> weights_;
  // The store's buffers are registered with the session: the store goes first.
  std::unique_ptr<Client> client_;
  std::unique_ptr<DaemonStore> store_;
#if STASH_DEMO_CUDA
  std::unique_ptr<CudaTrainer> trainer_;
#endif
  RankTotals totals_;
  bool parity_failed_ = false;
};

}  // namespace

int RunRank(const DemoFlags& flags, int rank, int report_fd, int hold_fd) {
  Rank r(flags, rank, report_fd, hold_fd);
  return r.Run();
}

}  // namespace stash::demo

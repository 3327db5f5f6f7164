// Recovery, the same in both modes (issue 21): a rank whose daemon died, restarted or drained
// goes on at its next BeginStep; what was lost says so; a drained rank keeps its tensors,
// finishes its reloads and ends its session; the getters describe the live session.
#include <signal.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Buffer;
using testing::DaemonProcess;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;

StashArgs Args(const HostBuffer& src, uint64_t rows) { return testing::Args(src, kPage, rows); }

// A ticket as the library's messages write it.
std::string Hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(value));
  return buf;
}

// Waits for `op`, or passes its error on.
StatusOr<Completion> Answer(Client& client, StatusOr<uint64_t> op) {
  if (!op.ok()) return op.status();
  return client.Wait(*op);
}

std::unique_ptr<v1::StashService::Stub> Stub(const std::string& socket) {
  return v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

// stashctl drain / undrain over the RPC; the daemon's answer.
v1::DrainResponse Drain(const std::string& socket, bool undrain) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::DrainRequest request;
  request.set_undrain(undrain);
  v1::DrainResponse response;
  const grpc::Status s = Stub(socket)->Drain(&ctx, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

int SessionsListed(const std::string& socket) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::ListSessionsResponse listed;
  const grpc::Status s = Stub(socket)->ListSessions(&ctx, v1::ListSessionsRequest(), &listed);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return listed.sessions_size();
}

// Polls `cond` every 10 ms for up to 10 s (scaled); whether it became true.
template <typename Cond>
bool Eventually(Cond cond) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

class Recovery : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    flags_ = {"--pool-bytes=8MiB", "--host-tier-bytes=0", "--page-bytes=64KiB", "--log-level=warn",
              "--backend=host"};
    daemon_ = std::make_unique<DaemonProcess>(flags_);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
    socket_ = daemon_->socket();
  }
  void TearDown() override {
    for (auto* d : {daemon_.get(), restarted_.get()}) {
      if (d != nullptr && d->process().running()) {
        EXPECT_EQ(d->process().StopWith(SIGTERM, seconds(5 * TimeScale())), 0)
            << d->process().Stderr();
      }
    }
  }
  std::unique_ptr<Client> Connect() {
    Options o;
    o.socket = socket_;
    o.mode = GetParam();
    if (o.mode == Mode::kMapped) {
      o.lease.automatic = false;
      o.lease.device_bytes = 2 << 20;
    }
    auto c = Client::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // stashd again on the same socket (the harness's Ready() watches its own path), with `extra`
  // flags after the first daemon's (the last of a flag given twice counts).
  void Restart(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> again = flags_;
    again.push_back("--socket=" + socket_);
    again.insert(again.end(), extra.begin(), extra.end());
    restarted_ = std::make_unique<DaemonProcess>(again);
    ASSERT_TRUE(Eventually(
        [&] { return testing::SocketAccepts(socket_) || !restarted_->process().running(); }));
    ASSERT_TRUE(restarted_->process().running()) << restarted_->process().Stderr();
  }
  bool mapped() const { return GetParam() == Mode::kMapped; }

  std::vector<std::string> flags_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<DaemonProcess> restarted_;
};

// Killed and restarted mid-step: daemon-copy's stashes of that step are lost and their reload
// says so (the ticket, "went away"), mapped's reload byte-exact; the next BeginStep reconnects
// in both modes, and the session id, the geometry and Stats() describe the new session.
TEST_P(Recovery, KilledDaemonIsReplacedAtTheNextStep) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  ASSERT_TRUE(client->Wait(*client->BeginStep(1)).ok());
  auto src = Buffer(4 * kPage, 7);
  auto stashed = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
  ASSERT_EQ(stashed->tier, Tier::kDevice);

  daemon_->process().StopWith(SIGKILL, seconds(5));
  Restart({"--pool-bytes=16MiB"});  // a new geometry: the getters must follow it

  auto dst = Buffer(4 * kPage);
  // Daemon-copy: the reload fails, at once or once the client saw the stream end.
  StatusOr<Completion> reload =
      Answer(*client, client->Reload({stashed->ticket, dst.get(), 0, false, {}, {}}));
  if (mapped()) {
    ASSERT_TRUE(reload.ok()) << reload.status().ToString();
    EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
  } else {
    // The first reload may have raced the end of the stream; by now the client saw it.
    EXPECT_TRUE(client->CurrentStepFlags().lost) << "the step lost a stash: it says so";
    ASSERT_FALSE(reload.ok());
    EXPECT_EQ(reload.status().code(), StatusCode::kUnavailable) << reload.status().ToString();
    StatusOr<Completion> lost =
        Answer(*client, client->Reload({stashed->ticket, dst.get(), 0, false, {}, {}}));
    ASSERT_FALSE(lost.ok());
    EXPECT_EQ(lost.status().code(), StatusCode::kUnavailable) << lost.status().ToString();
    EXPECT_NE(lost.status().message().find(Hex(stashed->ticket)), std::string::npos)
        << lost.status().ToString();
    EXPECT_NE(lost.status().message().find("went away"), std::string::npos)
        << lost.status().ToString();
  }

  if (mapped()) {
    EXPECT_FALSE(client->CurrentStepFlags().lost) << "mapped loses nothing";
  }
  auto step = client->Wait(*client->BeginStep(2));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_FALSE(client->CurrentStepFlags().lost);
  EXPECT_NE(client->session_id(), first);
  EXPECT_EQ(client->page_bytes(), kPage);
  EXPECT_EQ(client->pool_pages(), (16u << 20) / kPage) << "the new daemon's pool";
  auto again = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->tier, Tier::kDevice);
  EXPECT_FALSE(client->CurrentStepFlags().overflow);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->session_id, client->session_id());
  EXPECT_EQ(stats->stashes_live, 1u);
  ASSERT_TRUE(client->Wait(*client->Reload({again->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
  if (!mapped()) {
    // The lost ticket's release fails at once too (nothing of it is in the new daemon).
    EXPECT_FALSE(Answer(*client, client->Release(stashed->ticket)).ok());
  }
}

// No daemon answers: BeginStep says UNAVAILABLE (daemon-copy) or goes on with the chunks held
// (mapped), and a later BeginStep reconnects once one is back.
TEST_P(Recovery, AStepWithoutADaemonReconnectsOnceOneIsBack) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  daemon_->process().StopWith(SIGKILL, seconds(5));
  ASSERT_TRUE(Eventually([&] { return !client->Stats().ok(); }));
  auto step = client->BeginStep(1);
  if (mapped()) {
    ASSERT_TRUE(step.ok());
    EXPECT_TRUE(client->Wait(*step).ok());
  } else if (step.ok()) {
    // The stream's end may not have reached the client yet (the unary Stats above fails at
    // once): then the BeginStep went out on it, and its answer says the daemon went away.
    auto answered = client->Wait(*step);
    ASSERT_FALSE(answered.ok());
    EXPECT_EQ(answered.status().code(), StatusCode::kUnavailable) << answered.status().ToString();
  } else {
    EXPECT_EQ(step.status().code(), StatusCode::kUnavailable) << step.status().ToString();
  }
  Restart();
  // Attempts back off while no daemon answered (at most 1 s between two).
  ASSERT_TRUE(Eventually([&] {
    auto s = client->BeginStep(2);
    return s.ok() && client->Wait(*s).ok() && client->session_id() != first;
  }));
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->session_id, client->session_id());
}

// Attempts back off to 1 s while no daemon answers, but a daemon that started since the last
// failure is tried at once: the first BeginStep after the restart runs in a new session (a
// trainer whose steps are shorter than the backoff loses no step to it).
TEST_P(Recovery, TheFirstStepAfterARestartReconnectsWhileAttemptsBackOff) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  daemon_->process().StopWith(SIGKILL, seconds(5));
  ASSERT_TRUE(Eventually([&] { return !client->Stats().ok(); }));
  // Failed attempts, each after the last one's wait: the wait grows to its most (1 s).
  for (int step = 1; step <= 5; ++step) {
    auto s = client->BeginStep(step);
    if (s.ok()) (void)client->Wait(*s);
    std::this_thread::sleep_for(milliseconds(100 << (step - 1)));
  }
  auto failed = client->BeginStep(6);  // the last failure: the next attempt waits 1 s
  if (failed.ok()) (void)client->Wait(*failed);
  EXPECT_NE(client->session_id(), "") << "the getters keep describing the last session";
  Restart();
  auto s = client->BeginStep(7);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(client->Wait(*s).ok());
  if (mapped()) {
    // The new session replaces the old at the boundary the lease thread's answer reaches.
    ASSERT_TRUE(Eventually([&] { return client->session_id() != first; }));
  }
  EXPECT_NE(client->session_id(), first) << "the step right after the restart reconnected";
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->session_id, client->session_id());
}

// stashctl drain with a stash live: the drain counts it (mapped too); a new stash is kept by
// the caller without the overflow flag; the reload goes on; the session ends once nothing is
// left (the daemon lists none while the client lives); after undrain the next BeginStep opens
// a new session and stashes go to the daemon again.
TEST_P(Recovery, ADrainedSessionEndsOnceItsStashesAreBackAndReturnsAfterUndrain) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  ASSERT_TRUE(client->Wait(*client->BeginStep(1)).ok());
  auto src = Buffer(4 * kPage, 9);
  auto stashed = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();

  const v1::DrainResponse drained = Drain(socket_, /*undrain=*/false);
  EXPECT_TRUE(drained.draining());
  EXPECT_EQ(drained.sessions_live(), 1u);
  EXPECT_EQ(drained.stashes_live(), 1u);

  auto kept = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->tier, Tier::kOverflow);
  EXPECT_FALSE(client->CurrentStepFlags().overflow) << "nothing was lost: no rerun";
  auto dst = Buffer(4 * kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({stashed->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
  // Mapped: the session ends at the step boundary (the copier holds the chunks until then).
  auto step = client->Wait(*client->BeginStep(2));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_FALSE(step->step_overflow);
  ASSERT_TRUE(Eventually([&] { return SessionsListed(socket_) == 0; }))
      << "the drained session is still listed";
  EXPECT_FALSE(client->Stats().ok());
  auto still = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(still->tier, Tier::kOverflow);
  EXPECT_FALSE(client->CurrentStepFlags().overflow);

  Drain(socket_, /*undrain=*/true);
  ASSERT_TRUE(Eventually([&] {
    auto s = client->BeginStep(3);
    return s.ok() && client->Wait(*s).ok() && client->session_id() != first;
  }));
  auto back = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tier, Tier::kDevice);
  EXPECT_EQ(SessionsListed(socket_), 1);
}

// Undrained while the session still holds a stash: it never ended, and stashes go to the
// daemon again (daemon-copy: once the "undrained" message arrived).
TEST_P(Recovery, UndrainWhileConnectedStashesAgain) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  auto src = Buffer(4 * kPage, 11);
  auto held = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  Drain(socket_, false);
  auto kept = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->tier, Tier::kOverflow);
  Drain(socket_, true);
  ASSERT_TRUE(Eventually([&] {
    auto s = client->Wait(*client->Stash(Args(*src, 1)));
    return s.ok() && s->tier == Tier::kDevice;
  }));
  EXPECT_EQ(client->session_id(), first);
  EXPECT_FALSE(client->CurrentStepFlags().overflow);
}

// Drain, then the daemon stops and a new one starts: nothing was live, so no step is flagged
// and the next BeginStep after the restart runs in a new session.
TEST_P(Recovery, DrainThenRestartRunsEveryStepOnce) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string first = client->session_id();
  auto src = Buffer(4 * kPage, 13);
  Drain(socket_, false);
  auto kept = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->tier, Tier::kOverflow);
  // Drained: the daemon stops by itself once no session holds anything.
  ASSERT_TRUE(client->Wait(*client->BeginStep(1)).ok());
  EXPECT_EQ(daemon_->process().StopWith(SIGTERM, seconds(10 * TimeScale())), 0);
  // Between the stop and the restart, steps run here (nothing flagged).
  auto between = client->BeginStep(2);
  ASSERT_TRUE(between.ok()) << between.status().ToString();
  ASSERT_TRUE(client->Wait(*between).ok());
  EXPECT_FALSE(client->CurrentStepFlags().overflow);
  Restart();
  ASSERT_TRUE(Eventually([&] {
    auto s = client->BeginStep(3);
    return s.ok() && client->Wait(*s).ok() && client->session_id() != first;
  }));
  auto back = client->Wait(*client->Stash(Args(*src, 4)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tier, Tier::kDevice);
}

INSTANTIATE_TEST_SUITE_P(BothModes, Recovery, ::testing::Values(Mode::kDaemonCopy, Mode::kMapped),
                         [](const ::testing::TestParamInfo<Mode>& p) {
                           return p.param == Mode::kMapped ? std::string("Mapped")
                                                           : std::string("DaemonCopy");
                         });

}  // namespace
}  // namespace stash

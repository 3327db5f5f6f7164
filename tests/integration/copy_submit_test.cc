// Daemon-copy mode's submit path (issue 24): Stash() and Reload() only queue, and the session's
// writer thread hands memfds over and writes the requests, in call order. What the writer finds
// out later is the operation's answer, through Wait.
#include <signal.h>
#include <stdio.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stash/client.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash {
namespace {

using std::chrono::seconds;
using testing::Args;
using testing::Buffer;
using testing::DaemonProcess;
using testing::TimeScale;

constexpr uint64_t kBytes = 4096;

class CopySubmit : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> flags) {
    flags.emplace_back("--page-bytes=64KiB");
    flags.emplace_back("--log-level=warn");
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  std::unique_ptr<Client> Connect() {
    Options o;
    o.socket = daemon_->socket();
    o.mode = Mode::kDaemonCopy;
    auto c = Client::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  void TearDown() override {
    if (daemon_ != nullptr && daemon_->process().running()) {
      kill(daemon_->process().pid(), SIGCONT);
      EXPECT_EQ(daemon_->process().StopWith(SIGTERM, seconds(5 * TimeScale())), 0)
          << daemon_->process().Stderr();
    }
  }
  int64_t WaitMs() const { return 20000 * TimeScale(); }
  // Polls `op` (an operation nobody waits for) until it is answered: "" when it was, with OK,
  // else what went wrong.
  std::string PollAnswered(Client& client, uint64_t op) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(WaitMs());
    std::optional<StatusOr<Completion>> answer;
    while (!(answer = client.Poll(op)).has_value()) {
      if (std::chrono::steady_clock::now() > deadline) {
        return "an operation nobody waited for was never answered";
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return answer->ok() ? "" : "poll: " + answer->status().ToString();
  }
  // Runs `round(t, r)` for rounds r < kRounds on kThreads threads t at once; a thread stops at
  // its first failure (a non-empty answer), and each thread's first failure is reported.
  static constexpr int kThreads = 4;
  static constexpr int kRounds = 150;
  template <typename Round>
  static void OnThreads(Round round) {
    std::vector<std::thread> threads;
    std::vector<std::string> failures(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < kRounds && failures[t].empty(); ++r) {
          std::string failed = round(t, r);
          if (!failed.empty()) failures[t] = "round " + std::to_string(r) + ": " + failed;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// Stops the daemon (SIGSTOP) for its lifetime: it reads nothing, answers nothing. Returns once
// every thread of it stopped (kill returns before they do, and one still running may answer).
class Stopped {
 public:
  explicit Stopped(pid_t pid) : pid_(pid) {
    EXPECT_EQ(kill(pid_, SIGSTOP), 0);
    EXPECT_TRUE(testing::AllThreadsStopped(pid_)) << "the daemon's threads did not stop";
  }
  Stopped(const Stopped&) = delete;
  Stopped& operator=(const Stopped&) = delete;
  ~Stopped() { Resume(); }
  void Resume() {
    if (pid_ > 0) {
      EXPECT_EQ(kill(pid_, SIGCONT), 0);
    }
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

// A buffer the session never saw needs its memfd handed to the daemon, a round trip: Stash()
// and Reload() return without it, while the daemon cannot even read, and their answers come
// once it runs again.
TEST_F(CopySubmit, StashAndReloadReturnWhileTheDaemonReadsNothing) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto src = Buffer(kBytes, 11);
  auto dst = Buffer(kBytes);
  auto events = Buffer(4096);
  StashArgs a = Args(*src, kBytes, 1);
  a.done = {events.get(), 0, 1};

  Stopped stopped(daemon_->process().pid());
  auto ticket = client->Stash(a);
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ReloadArgs r;
  r.ticket = *ticket;
  r.destination = dst.get();
  r.done = {events.get(), 0, 2};
  auto reload = client->Reload(r);
  ASSERT_TRUE(reload.ok()) << reload.status().ToString();
  // A stopped daemon answers nothing: both are still pending.
  EXPECT_FALSE(client->Poll(*ticket).has_value());
  EXPECT_FALSE(client->Poll(*reload).has_value());
  EXPECT_FALSE(WaitEvent(a.done, 0));

  stopped.Resume();
  auto stashed = client->Wait(*ticket, WaitMs());
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
  EXPECT_EQ(stashed->tier, Tier::kDevice);
  auto reloaded = client->Wait(*reload, WaitMs());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kBytes), 0);
  EXPECT_TRUE(WaitEvent(r.done, 0));
}

// Stashes and reloads of many buffers (each new one registered on the way), none waited for
// until the end: each reload reaches the daemon after the stash it names, so every one finds its
// stash, and the bytes come back. (At most 24 buffers: the daemon holds at most 64 memfds per
// session whose RegisterMemory it has not seen yet, and refuses more.)
TEST_F(CopySubmit, OrderHoldsOverAThousandMixedStashesAndReloads) {
  StartDaemon({"--pool-bytes=16MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const uint32_t seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  constexpr int kOps = 1000;
  constexpr size_t kSources = 16;
  constexpr size_t kMaxLive = 48;  // 48 pages of the pool's 256
  constexpr size_t kSlotsPerDestination = 64;
  std::vector<std::unique_ptr<HostBuffer>> sources;
  std::vector<std::unique_ptr<HostBuffer>> destinations;  // a new one every 64 reloads
  size_t reloads = 0;
  auto events = Buffer(4096);
  struct Live {
    uint64_t ticket;
    size_t source;
  };
  std::vector<Live> live;
  struct Op {
    uint64_t id;
    bool stash;
    size_t source;       // stash, reload: the bytes expected
    size_t destination;  // reload: its slot, the reload's index
  };
  std::vector<Op> ops;
  uint64_t done_value = 0;
  for (int i = 0; i < kOps; ++i) {
    const bool stash = live.empty() || (live.size() < kMaxLive && rng() % 2 == 0);
    if (stash) {
      // A new source now and then, so registrations interleave with the operations.
      if (sources.size() < kSources && (sources.empty() || rng() % 16 == 0)) {
        sources.push_back(Buffer(kBytes, seed + static_cast<uint32_t>(sources.size()) + 1));
      }
      const size_t s = rng() % sources.size();
      StashArgs a = Args(*sources[s], kBytes, 1);
      a.done = {events.get(), 0, ++done_value};
      auto ticket = client->Stash(a);
      ASSERT_TRUE(ticket.ok()) << "op " << i << ": " << ticket.status().ToString();
      live.push_back({*ticket, s});
      ops.push_back({*ticket, true, s, 0});
    } else {
      const size_t pick = rng() % live.size();
      const Live l = live[pick];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
      // Each reload into its own 4 KiB slot.
      if (reloads % kSlotsPerDestination == 0) {
        destinations.push_back(Buffer(kSlotsPerDestination * kBytes));
      }
      ReloadArgs r;
      r.ticket = l.ticket;
      r.destination = destinations.back().get();
      r.offset = (reloads % kSlotsPerDestination) * kBytes;
      r.done = {events.get(), 0, ++done_value};
      auto op = client->Reload(r);
      ASSERT_TRUE(op.ok()) << "op " << i << ": " << op.status().ToString();
      ops.push_back({*op, false, l.source, reloads++});
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    auto answer = client->Wait(ops[i].id, WaitMs());
    ASSERT_TRUE(answer.ok()) << "op " << i << (ops[i].stash ? " (stash): " : " (reload): ")
                             << answer.status().ToString();
    if (ops[i].stash) {
      EXPECT_EQ(answer->tier, Tier::kDevice) << "op " << i;
    } else {
      const size_t slot = ops[i].destination;
      const uint8_t* got = destinations[slot / kSlotsPerDestination]->data() +
                           (slot % kSlotsPerDestination) * kBytes;
      EXPECT_EQ(std::memcmp(got, sources[ops[i].source]->data(), kBytes), 0) << "op " << i;
    }
  }
  EXPECT_TRUE(WaitEvent({events.get(), 0, done_value}, 0));
}

// A memfd the writer thread cannot hand over (here: the descriptor socket is gone) fails the
// operations that name it through Wait, with the descriptor channel's words; the session goes
// on, and the buffer is handed over again by the next operation that names it.
TEST_F(CopySubmit, AMemfdThatCannotBeHandedOverFailsItsOperationsThroughWait) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string fd_socket = daemon_->socket() + ".fd";
  const std::string moved = daemon_->dir() + "/moved.fd";
  ASSERT_EQ(std::rename(fd_socket.c_str(), moved.c_str()), 0);
  auto src = Buffer(kBytes, 12);
  auto events = Buffer(4096);
  StashArgs a = Args(*src, kBytes, 1);
  a.done = {events.get(), 0, 1};
  auto first = client->Stash(a);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  a.done = {events.get(), 0, 2};
  auto second = client->Stash(a);  // queued behind the first, counting on its registration
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  for (uint64_t op : {*first, *second}) {
    auto answer = client->Wait(op, WaitMs());
    EXPECT_EQ(answer.status().code(), StatusCode::kUnavailable) << answer.status().ToString();
    EXPECT_NE(answer.status().message().find("descriptor socket " + fd_socket), std::string::npos)
        << answer.status().message();
  }
  EXPECT_TRUE(WaitEvent({events.get(), 0, 2}, 0)) << "an answered operation's done event is up";

  ASSERT_EQ(std::rename(moved.c_str(), fd_socket.c_str()), 0);
  a.done = {events.get(), 0, 3};
  auto third = client->Stash(a);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  auto stashed = client->Wait(*third, WaitMs());
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
  EXPECT_EQ(stashed->tier, Tier::kDevice);
  auto dst = Buffer(kBytes);
  ReloadArgs r;
  r.ticket = *third;
  r.destination = dst.get();
  auto reload = client->Reload(r);
  ASSERT_TRUE(reload.ok()) << reload.status().ToString();
  auto reloaded = client->Wait(*reload, WaitMs());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kBytes), 0);
}

// A caller that waits for an operation the writer has not taken yet writes it itself; the
// writer still writes what nobody waits for. Threads mix both: stashes waited for at once,
// stashes only polled, reloads checked byte for byte. Then one thread alone stashes and only
// polls: nobody but the writer sends those, so a writer left asleep with work queued (after a
// waiter took what woke it) times that phase out.
TEST_F(CopySubmit, WaitersWriteTheirOwnOperationsAndTheWriterTheRest) {
  StartDaemon({"--pool-bytes=16MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> srcs;
  std::vector<std::unique_ptr<HostBuffer>> dsts;
  for (int t = 0; t < kThreads; ++t) {
    srcs.push_back(Buffer(kBytes, static_cast<uint32_t>(t) + 1));
    dsts.push_back(Buffer(kBytes));
  }
  OnThreads([&](int t, int round) -> std::string {
    HostBuffer& src = *srcs[t];
    HostBuffer& dst = *dsts[t];
    auto ticket = client->Stash(Args(src, kBytes, 1));
    if (!ticket.ok()) return ticket.status().ToString();
    if ((round + t) % 2 == 0) {
      auto answer = client->Wait(*ticket, WaitMs());
      if (!answer.ok()) return "wait: " + answer.status().ToString();
    } else if (std::string polled = PollAnswered(*client, *ticket); !polled.empty()) {
      return polled;
    }
    std::memset(dst.data(), 0, kBytes);
    ReloadArgs r;
    r.ticket = *ticket;
    r.destination = &dst;
    auto op = client->Reload(r);
    if (!op.ok()) return op.status().ToString();
    auto reloaded = client->Wait(*op, WaitMs());
    if (!reloaded.ok()) return "reload: " + reloaded.status().ToString();
    if (std::memcmp(dst.data(), src.data(), kBytes) != 0) return "the reloaded bytes differ";
    return "";
  });

  auto src = Buffer(kBytes, 99);
  for (int round = 0; round < 200; ++round) {
    auto ticket = client->Stash(Args(*src, kBytes, 1));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    if (round % 2 == 0) {
      ASSERT_TRUE(client->Wait(*ticket, WaitMs()).ok());  // written here, or by the writer
    } else {
      ASSERT_EQ(PollAnswered(*client, *ticket), "")
          << "round " << round << ": the writer never sent a stash nobody waited for";
    }
    auto release = client->Release(*ticket);
    ASSERT_TRUE(release.ok()) << release.status().ToString();
    ASSERT_TRUE(client->Wait(*release, WaitMs()).ok());
  }
}

// StashAndWait / ReloadAndWait: the calling thread writes its own request and the writer sleeps
// on, except for a buffer new to the session, whose memfd only the writer hands over (it is
// woken for it: with a writer left asleep, these first calls would never be answered). Threads
// mix the one-call form with Stash() + Poll(), which nobody waits for: the writer, or another
// thread's wait that finds them queued ahead of its own, writes those.
TEST_F(CopySubmit, StashAndWaitAnswersInOneCallAndTheWriterServesTheRest) {
  StartDaemon({"--pool-bytes=16MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> srcs(kThreads);
  std::vector<std::unique_ptr<HostBuffer>> dsts(kThreads);
  OnThreads([&](int t, int round) -> std::string {
    // A new pair of buffers now and then: their memfds go over through the writer.
    if (round % 50 == 0) {
      srcs[t] = Buffer(kBytes, static_cast<uint32_t>(t * 1000 + round) + 1);
      dsts[t] = Buffer(kBytes);
    }
    HostBuffer& src = *srcs[t];
    HostBuffer& dst = *dsts[t];
    uint64_t ticket = 0;
    if ((round + t) % 3 != 0) {
      auto stashed = client->StashAndWait(Args(src, kBytes, 1), WaitMs(), &ticket);
      if (!stashed.ok()) return "stash: " + stashed.status().ToString();
      if (stashed->ticket != ticket) return "the answer names another ticket";
      if (stashed->tier != Tier::kDevice) return "not in the pool";
    } else {
      auto queued = client->Stash(Args(src, kBytes, 1));
      if (!queued.ok()) return queued.status().ToString();
      ticket = *queued;
      if (std::string polled = PollAnswered(*client, ticket); !polled.empty()) return polled;
    }
    std::memset(dst.data(), 0, kBytes);
    ReloadArgs r;
    r.ticket = ticket;
    r.destination = &dst;
    uint64_t op = 0;
    auto reloaded = client->ReloadAndWait(r, WaitMs(), &op);
    if (!reloaded.ok()) return "reload: " + reloaded.status().ToString();
    if (op == 0 || reloaded->ticket != ticket) return "reload names no op";
    if (std::memcmp(dst.data(), src.data(), kBytes) != 0) return "the reloaded bytes differ";
    return "";
  });
}

// A one-call wait that times out says DEADLINE_EXCEEDED and still hands the ticket out: the
// stash goes on, and a later Wait gets its answer. Bad arguments are refused before anything is
// queued (no ticket), and the daemon's refusal is the answer.
TEST_F(CopySubmit, StashAndWaitTimesOutWithTheTicketAndRefusesBadArguments) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto src = Buffer(kBytes, 21);
  auto dst = Buffer(kBytes);
  ASSERT_TRUE(client->StashAndWait(Args(*src, kBytes, 1), WaitMs()).ok());  // registers src

  uint64_t ticket = 0;
  {
    Stopped stopped(daemon_->process().pid());
    auto late = client->StashAndWait(Args(*src, kBytes, 1), 100, &ticket);
    EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().ToString();
    ASSERT_NE(ticket, 0u);
  }
  auto stashed = client->Wait(ticket, WaitMs());
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
  EXPECT_EQ(stashed->ticket, ticket);
  ReloadArgs r;
  r.ticket = ticket;
  r.destination = dst.get();
  auto reloaded = client->ReloadAndWait(r, WaitMs());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kBytes), 0);

  uint64_t untouched = 0;
  EXPECT_EQ(client->StashAndWait(Args(*src, kBytes, 2), WaitMs(), &untouched).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(untouched, 0u);
  auto spent = client->ReloadAndWait(r, WaitMs(), &untouched);  // the ticket is spent
  EXPECT_EQ(spent.status().code(), StatusCode::kNotFound) << spent.status().ToString();
  EXPECT_NE(untouched, 0u);
}

// Bad arguments are still refused on the caller's thread, before anything is queued.

TEST_F(CopySubmit, BadArgumentsAreRefusedAtOnce) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto src = Buffer(kBytes);
  StashArgs past_the_end = Args(*src, kBytes, 2);
  EXPECT_EQ(client->Stash(past_the_end).status().code(), StatusCode::kInvalidArgument);
  StashArgs bad_event = Args(*src, kBytes, 1);
  bad_event.done = {src.get(), 3, 1};
  EXPECT_EQ(client->Stash(bad_event).status().code(), StatusCode::kInvalidArgument);
  ReloadArgs no_ticket;
  no_ticket.destination = src.get();
  EXPECT_EQ(client->Reload(no_ticket).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stash

// The pool's ordering rule at the end of a session and at shutdown: a session's stream may end
// only once every copy and done write submitted for it finished. The client raises its pending
// done counters when the stream ends; a done write of the daemon landing after that raise could
// move a counter back (the cuda executor's writes are plain stores) and hang a stream waiting
// on it. Tested on the host backend's executor, run the way a GPU stream runs it: submitted
// work waits in a queue until the test lets it run.
//
// And the run token (InlinePoolTest): with the synchronous host executor, a small request that
// finds the worker idle runs on the thread that received it; anything else goes to the worker,
// and a session's order holds either way.
#include "daemon/copy/pool.h"
#include "daemon/copy/copy_state.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/copy_workers.h"
#include "common/host_event.h"
#include "daemon/copy/host_executor.h"
#include "daemon/sessions/session.h"
#include "daemon/stats/stats.h"
#include "daemon/tiers/tier.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSource = 1;    // memory id of the stash's source
constexpr uint64_t kCounters = 2;  // memory id of the done counter
constexpr uint64_t kRowBytes = 256;
constexpr uint64_t kRows = 40;

// Client memory the test owns: the executor addresses and the CPU reads the same bytes.
class HeapMemory final : public MappedMemory {
 public:
  explicit HeapMemory(std::vector<uint8_t>* bytes)
      : MappedMemory(bytes->data(), bytes->data(), bytes->size()) {}
};

// A host executor behind a queue, like the copy stream of the cuda backend: Stash, Reload,
// Raise and Fence return at once and run, in submission order, only when the test calls
// RunAll(); continuations go to the pool worker.
class StreamLikeExecutor final : public CopyExecutor {
 public:
  StreamLikeExecutor(Tier* device, CopyWorkers* workers) : inner_(device, nullptr, workers) {}

  Tier* device_tier() const override { return inner_.device_tier(); }
  Tier* host_tier() const override { return inner_.host_tier(); }
  void Attach(std::function<void(Then)> post) override { post_ = std::move(post); }
  StatusOr<std::unique_ptr<MappedMemory>> Open(const v1::RegisterMemory& reg,
                                               UniqueFd fd) override {
    return inner_.Open(reg, std::move(fd));
  }
  void Stash(const StashWork& work, Then then) override {
    Submit(Kind::kStash, [this, work, then = std::move(then)]() mutable {
      inner_.Stash(work, [] {});
      post_(std::move(then));
    });
  }
  void Reload(const ReloadWork& work, Then then) override {
    Submit(Kind::kReload, [this, work, then = std::move(then)]() mutable {
      inner_.Reload(work, [] {});
      post_(std::move(then));
    });
  }
  void Raise(const DoneSignal& done) override {
    Submit(Kind::kRaise, [this, done] { inner_.Raise(done); });
  }
  void Fence(Then then) override {
    Submit(Kind::kFence, [this, then = std::move(then)]() mutable { post_(std::move(then)); });
  }
  void CheckHealth() override {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook.swap(health_hook_);
    }
    if (hook) hook();
  }

  // Runs `hook` inside the next CheckHealth call (once).
  void OnNextHealthCheck(std::function<void()> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    health_hook_ = std::move(hook);
  }

  enum class Kind { kStash, kReload, kRaise, kFence };

  // Blocks until `n` items of `kind` were submitted in all.
  void AwaitSubmitted(Kind kind, int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return submitted_[static_cast<int>(kind)] >= n; });
  }

  // Runs everything submitted so far, in order, on the calling thread.
  void RunAll() {
    std::deque<std::function<void()>> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work.swap(queue_);
    }
    for (auto& w : work) w();
  }

 private:
  void Submit(Kind kind, std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    ++submitted_[static_cast<int>(kind)];
    cv_.notify_all();
  }

  HostExecutor inner_;
  std::function<void(Then)> post_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  int submitted_[4] = {};                    // guarded by mu_
  std::function<void()> health_hook_;        // guarded by mu_
};

class RecordingSink final : public ResponseSink {
 public:
  void Send(v1::SessionResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    responses_.push_back(std::move(response));
    threads_.push_back(std::this_thread::get_id());
    cv_.notify_all();
  }
  // The thread that sent the answer to `request_id` (after Await).
  std::thread::id ThreadOf(uint64_t request_id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < responses_.size(); ++i) {
      if (responses_[i].request_id() == request_id) return threads_[i];
    }
    return {};
  }
  // The answers so far, in the order they were sent.
  std::vector<uint64_t> Order() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint64_t> ids;
    for (const auto& r : responses_) ids.push_back(r.request_id());
    return ids;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return responses_.size();
  }
  v1::SessionResponse Await(uint64_t request_id) {
    std::unique_lock<std::mutex> lock(mu_);
    v1::SessionResponse found;
    cv_.wait(lock, [&] {
      for (const auto& r : responses_) {
        if (r.request_id() == request_id) {
          found = r;
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::SessionResponse> responses_;
  std::vector<std::thread::id> threads_;
};

// Signals once, from any thread; records the done counter's value when it was signalled.
class Closed {
 public:
  explicit Closed(const uint64_t* counter) : counter_(counter) {}
  std::function<void()> Callback() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      value_at_close_ = EventValue(counter_);
      ++calls_;
      cv_.notify_all();
    };
  }
  uint64_t Await() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return calls_ > 0; });
    return value_at_close_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  const uint64_t* const counter_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t value_at_close_ = 0;  // guarded by mu_
  int calls_ = 0;                // guarded by mu_
};

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tier = Tier::Create("gpu0", 0, kPage, 16);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(tier).value();
    auto executor = std::make_unique<StreamLikeExecutor>(tier_.get(), &workers_);
    executor_ = executor.get();
    pool_ = std::make_unique<Pool>(0, std::move(executor), &counters_);
    session_ = std::make_shared<Session>(SessionInfo{}, &sink_, nullptr);
    // Worker-side state, set before the first request reaches the worker (the queue's mutex
    // orders it).
    source_.assign(kRows * kRowBytes, 0x5a);
    events_.assign(64, 0);
    CopyState::Of(*session_).memories[kSource] =
        ClientMemory{std::make_shared<HeapMemory>(&source_), {}, source_.size()};
    CopyState::Of(*session_).memories[kCounters] =
        ClientMemory{std::make_shared<HeapMemory>(&events_), {}, events_.size()};
  }

  void TearDown() override {
    if (executor_ != nullptr) executor_->RunAll();  // nothing may stay queued behind Stop
    pool_.reset();
  }

  uint64_t* counter() { return reinterpret_cast<uint64_t*>(events_.data()); }

  // A stash of every row of the source whose done event raises the counter to `done`.
  static v1::SessionRequest StashWithDone(uint64_t request_id, uint64_t done) {
    v1::SessionRequest r;
    r.set_request_id(request_id);
    v1::Stash* s = r.mutable_stash();
    s->set_ticket(request_id);
    s->mutable_source()->set_memory_id(kSource);
    s->set_row_bytes(kRowBytes);
    s->set_max_rows(kRows);
    s->mutable_count()->set_value(kRows);
    s->mutable_done()->mutable_counter()->set_memory_id(kCounters);
    s->mutable_done()->set_value(done);
    return r;
  }

  CopyWorkers workers_{1};
  DaemonCounters counters_;
  std::unique_ptr<Tier> tier_;
  StreamLikeExecutor* executor_ = nullptr;  // owned by pool_
  std::unique_ptr<Pool> pool_;
  RecordingSink sink_;
  std::shared_ptr<Session> session_;
  std::vector<uint8_t> source_;
  std::vector<uint8_t> events_;
};

TEST_F(PoolTest, SessionClosesOnlyAfterItsSubmittedDoneWritesLanded) {
  pool_->Enqueue(session_, StashWithDone(7, 1), std::chrono::steady_clock::now());
  executor_->AwaitSubmitted(StreamLikeExecutor::Kind::kStash, 1);

  Closed closed(counter());
  pool_->CloseSession(session_, closed.Callback());
  // The teardown went through the worker: it returns the stash's pages and fences behind the
  // copy, which has not run.
  executor_->AwaitSubmitted(StreamLikeExecutor::Kind::kFence, 1);
  EXPECT_EQ(closed.calls(), 0) << "the stream may not end while the session's copy is queued";
  EXPECT_EQ(EventValue(counter()), 0u);

  executor_->RunAll();
  // When the stream may end, the daemon's own done write has landed: a raise by the client
  // after that can no longer be undone by it.
  EXPECT_EQ(closed.Await(), 1u);
  EXPECT_EQ(closed.calls(), 1);
  EXPECT_EQ(tier_->Snapshot().pages_used, 0u) << "the teardown returned the stash's pages";
}

TEST_F(PoolTest, StopWaitsForSubmittedWorkAndLaterCloseEndsAtOnce) {
  pool_->Enqueue(session_, StashWithDone(7, 1), std::chrono::steady_clock::now());
  executor_->AwaitSubmitted(StreamLikeExecutor::Kind::kStash, 1);
  std::thread stopper([&] { pool_->Stop(); });
  // Stop returns only after the queued copy ran (and with it its done write).
  executor_->RunAll();
  stopper.join();
  EXPECT_EQ(EventValue(counter()), 1u);
  EXPECT_EQ(sink_.Await(7).code(), 0);

  // Shutdown ends the streams after Stop: nothing is in flight, the close completes at once.
  Closed closed(counter());
  pool_->CloseSession(session_, closed.Callback());
  EXPECT_EQ(closed.calls(), 1);
  EXPECT_EQ(closed.Await(), 1u);
}

// The health check (a driver call on the cuda backend) runs outside the pool's lock: the
// executor's host callbacks post completions through that lock meanwhile and must not wait for
// it. Here a completion is posted from another thread while the check runs.
TEST_F(PoolTest, HealthCheckRunsOutsideThePoolLock) {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, posted = false, saw_post = false;
  executor_->OnNextHealthCheck([&] {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    // Bounded, so that a check under the lock fails this test instead of hanging it.
    saw_post = cv.wait_for(lock, std::chrono::seconds(10), [&] { return posted; });
  });
  pool_->Enqueue(session_, StashWithDone(7, 1), std::chrono::steady_clock::now());
  executor_->AwaitSubmitted(StreamLikeExecutor::Kind::kStash, 1);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  executor_->RunAll();  // posts the stash's continuation (Pool::Post takes the pool's lock)
  {
    std::lock_guard<std::mutex> lock(mu);
    posted = true;
    cv.notify_all();
  }
  EXPECT_EQ(sink_.Await(7).code(), 0);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(saw_post) << "Post waited for the health check";
}

TEST_F(PoolTest, RequestsAfterStopAreAnsweredUnavailable) {
  pool_->Stop();
  pool_->Enqueue(session_, StashWithDone(9, 1), std::chrono::steady_clock::now());
  const v1::SessionResponse r = sink_.Await(9);
  EXPECT_EQ(r.code(), static_cast<int>(StatusCode::kUnavailable));
  EXPECT_NE(r.message().find("shutting down"), std::string::npos) << r.message();
  EXPECT_EQ(session_->counters().inflight.load(), 0u);
}

// The same pool on the host backend's own executor, which runs work before it returns.
class InlinePoolTest : public PoolTest {
 protected:
  void SetUp() override {
    PoolTest::SetUp();
    pool_.reset();
    executor_ = nullptr;
    pool_ = std::make_unique<Pool>(
        0, std::make_unique<HostExecutor>(tier_.get(), nullptr, &workers_), &counters_);
  }

  // A stash of the source's rows with room for `max_rows` (what decides whether it is light).
  static v1::SessionRequest Stash(uint64_t request_id, uint64_t max_rows) {
    v1::SessionRequest r = StashWithDone(request_id, request_id);
    r.mutable_stash()->set_max_rows(max_rows);
    return r;
  }
  // The same, waiting for the ready counter (the second word of `events_`) to reach 1.
  static v1::SessionRequest StashAfterReady(uint64_t request_id) {
    v1::SessionRequest r = Stash(request_id, kRows);
    r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(kCounters);
    r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(8);
    r.mutable_stash()->mutable_ready()->set_value(1);
    return r;
  }
  static v1::SessionRequest Release(uint64_t request_id, uint64_t ticket) {
    v1::SessionRequest r;
    r.set_request_id(request_id);
    r.mutable_release()->set_ticket(ticket);
    return r;
  }
  // Until the worker holds no token and has nothing to do: an answer goes out before the
  // worker (or an inline op's completion, which the worker runs) gives the token back, and a
  // small request runs inline only once it has.
  void AwaitIdle() {
    for (int i = 0; i < 30000 && !pool_->Idle(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(pool_->Idle());
  }
};

TEST_F(InlinePoolTest, ASmallStashIsAnsweredOnTheThreadThatReceivedIt) {
  AwaitIdle();
  pool_->Enqueue(session_, Stash(7, kRows), std::chrono::steady_clock::now());
  // Answered before Enqueue returned: no hand-off to the worker.
  ASSERT_EQ(sink_.size(), 1u);
  EXPECT_EQ(sink_.Await(7).code(), 0) << sink_.Await(7).message();
  EXPECT_EQ(sink_.ThreadOf(7), std::this_thread::get_id());
  EXPECT_EQ(EventValue(counter()), 7u) << "the done event went up";
  EXPECT_EQ(tier_->Snapshot().pages_used, 3u);

  AwaitIdle();
  pool_->Enqueue(session_, Release(8, 7), std::chrono::steady_clock::now());
  ASSERT_EQ(sink_.size(), 2u);
  EXPECT_EQ(sink_.Await(8).code(), 0) << sink_.Await(8).message();
  EXPECT_EQ(tier_->Snapshot().pages_used, 0u);
  EXPECT_EQ(session_->counters().inflight.load(), 0u);
}

TEST_F(InlinePoolTest, ALargeStashGoesToTheWorker) {
  // Room for 300 rows of 256 bytes (75 KiB): more than a gRPC thread copies.
  pool_->Enqueue(session_, Stash(7, 300), std::chrono::steady_clock::now());
  EXPECT_EQ(sink_.Await(7).code(), 0) << sink_.Await(7).message();
  EXPECT_NE(sink_.ThreadOf(7), std::this_thread::get_id());
}

// What a request writes decides, not what it names: a reload of 10 KiB that zeroes up to its
// 75 KiB max_rows, and a stash the pool's own tier cannot hold (it would spill or overflow,
// locking the host tier another pool may hold), go to the worker.
TEST_F(InlinePoolTest, AReloadZeroingALargeTailAndAStashThatWouldNotFitGoToTheWorker) {
  v1::SessionRequest wide = Stash(7, 300);  // 40 rows of room for 300
  pool_->Enqueue(session_, std::move(wide), std::chrono::steady_clock::now());
  ASSERT_EQ(sink_.Await(7).code(), 0) << sink_.Await(7).message();
  std::vector<uint8_t> wide_destination(300 * kRowBytes, 0xEE);
  constexpr uint64_t kWide = 3;
  CopyState::Of(*session_).memories[kWide] =
      ClientMemory{std::make_shared<HeapMemory>(&wide_destination), {}, wide_destination.size()};
  v1::SessionRequest reload;
  reload.set_request_id(8);
  reload.mutable_reload()->set_ticket(7);
  reload.mutable_reload()->mutable_destination()->set_memory_id(kWide);
  reload.mutable_reload()->set_zero_tail(true);
  pool_->Enqueue(session_, std::move(reload), std::chrono::steady_clock::now());
  ASSERT_EQ(sink_.Await(8).code(), 0) << sink_.Await(8).message();
  EXPECT_NE(sink_.ThreadOf(8), std::this_thread::get_id()) << "75 KiB zeroed on a gRPC thread";
  EXPECT_EQ(wide_destination[kRows * kRowBytes], 0) << "the tail was zeroed";
  // 16 pages of 4 KiB: five stashes of 3 pages leave one page.
  for (uint64_t id = 10; id < 15; ++id) {
    AwaitIdle();
    pool_->Enqueue(session_, Stash(id, kRows), std::chrono::steady_clock::now());
    ASSERT_EQ(sink_.Await(id).code(), 0) << sink_.Await(id).message();
    EXPECT_EQ(sink_.ThreadOf(id), std::this_thread::get_id());
  }
  pool_->Enqueue(session_, Stash(15, kRows), std::chrono::steady_clock::now());
  EXPECT_EQ(sink_.Await(15).stash().tier(), v1::TIER_OVERFLOW);
  EXPECT_NE(sink_.ThreadOf(15), std::this_thread::get_id());
}

TEST_F(InlinePoolTest, ARequestBehindAWaitingOneOfItsSessionKeepsItsTurn) {
  pool_->Enqueue(session_, StashAfterReady(7), std::chrono::steady_clock::now());
  // Its release, small and ready, must not run before the stash it releases.
  pool_->Enqueue(session_, Release(8, 7), std::chrono::steady_clock::now());
  EXPECT_EQ(sink_.size(), 0u) << "nothing may be answered before the ready event";
  EventSignal(counter() + 1, 1);
  EXPECT_EQ(sink_.Await(8).code(), 0) << sink_.Await(8).message();
  EXPECT_EQ(sink_.Order(), (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(sink_.Await(7).code(), 0);
  EXPECT_NE(sink_.ThreadOf(7), std::this_thread::get_id()) << "the worker ran the waiting stash";
  EXPECT_EQ(tier_->Snapshot().pages_used, 0u);
}

// Threads enqueue for several sessions at once, small and large, as gRPC's threads do: the
// token keeps one runner at a time (TSan checks the rings and records), and every stash and
// release is answered and accounted for.
TEST_F(InlinePoolTest, ManyReceivingThreadsShareOnePool) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::unique_ptr<RecordingSink>> sinks;
  std::vector<std::shared_ptr<Session>> sessions;
  for (int t = 0; t < kThreads; ++t) {
    sinks.push_back(std::make_unique<RecordingSink>());
    sessions.push_back(std::make_shared<Session>(SessionInfo{}, sinks.back().get(), nullptr));
    CopyState::Of(*sessions.back()).memories[kSource] =
        ClientMemory{std::make_shared<HeapMemory>(&source_), {}, source_.size()};
    CopyState::Of(*sessions.back()).memories[kCounters] =
        ClientMemory{std::make_shared<HeapMemory>(&events_), {}, events_.size()};
  }
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < kRounds; ++i) {
        const uint64_t id = 2 * i + 1;
        // Every other stash is large (the worker's); the rest may run here.
        v1::SessionRequest stash = Stash(id, i % 2 == 0 ? kRows : 300);
        stash.mutable_stash()->clear_done();
        pool_->Enqueue(sessions[t], std::move(stash), std::chrono::steady_clock::now());
        pool_->Enqueue(sessions[t], Release(id + 1, id), std::chrono::steady_clock::now());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (uint64_t i = 0; i < kRounds; ++i) {
      const uint64_t id = 2 * i + 1;
      const v1::SessionResponse stashed = sinks[t]->Await(id);
      const v1::SessionResponse released = sinks[t]->Await(id + 1);
      // A stash may overflow when the other threads hold the pool's 16 pages; its release then
      // says it holds no data. Either way the two answers agree.
      if (stashed.stash().tier() == v1::TIER_OVERFLOW) {
        EXPECT_NE(released.code(), 0);
      } else {
        EXPECT_EQ(stashed.code(), 0) << stashed.message();
        EXPECT_EQ(released.code(), 0) << released.message();
      }
    }
    EXPECT_EQ(sinks[t]->size(), 2u * kRounds);
  }
  EXPECT_EQ(tier_->Snapshot().pages_used, 0u);
  for (const auto& s : sessions) EXPECT_EQ(s->counters().inflight.load(), 0u);
}

}  // namespace
}  // namespace stash::daemon

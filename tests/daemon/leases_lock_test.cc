// The mapped-mode broker's locking (daemon/leases/leases.cc, daemon/leases/lease_returns.cc): its
// lock is never held while a lender works on memory. A GPU's chunk take waits for that GPU's copy
// stream and a GPU chunk's renew releases and commits VRAM; here a lender that stops at a gate
// stands in for both, and the calls on other threads must go on while it waits: stats, a session's
// end, the reaper. The daemon makes every lease and return on its descriptor server's one thread;
// these tests also run leases and returns on separate threads, which asks more of the books than
// the daemon does.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "daemon/leases/leases.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using std::chrono::seconds;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kChunkPages = 4;

// A tier's own lender, with a gate in front of Take or Renew that stops the caller until the
// test opens it.
class GatedLender final : public ChunkLender {
 public:
  explicit GatedLender(ChunkLender* real) : real_(real) {}

  void CloseBeforeTake() { Close(&take_closed_); }
  void CloseBeforeRenew() { Close(&renew_closed_); }
  // True once a call stopped at the closed gate (within 10 s).
  bool WaitStopped() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(10), [&] { return stopped_ > 0; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    take_closed_ = renew_closed_ = false;
    cv_.notify_all();
  }

  StatusOr<std::vector<Taken>> Take(const Want& want) override {
    Stop(&take_closed_);
    return real_->Take(want);
  }
  void Return(uint64_t chunk) override { real_->Return(chunk); }
  Status Renew(uint64_t chunk) override {
    Stop(&renew_closed_);
    ++renews_;
    if (failing_renews_) return ResourceExhaustedError("the test's lender has no memory");
    return real_->Renew(chunk);
  }
  // Renew fails (as out of memory would) until FailRenews(false); counts every Renew call.
  void FailRenews(bool fail) { failing_renews_ = fail; }
  int renews() const { return renews_; }
  StatusOr<UniqueFd> Export(uint64_t chunk) override { return real_->Export(chunk); }
  uint64_t ChunkBytes(uint64_t chunk) const override { return real_->ChunkBytes(chunk); }
  std::vector<uint64_t> Waiting() override { return real_->Waiting(); }

 private:
  void Close(bool* gate) {
    std::lock_guard<std::mutex> lock(mu_);
    *gate = true;
    stopped_ = 0;
  }
  void Stop(const bool* gate) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!*gate) return;
    ++stopped_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !*gate; });
  }

  ChunkLender* const real_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool take_closed_ = false;
  bool renew_closed_ = false;
  int stopped_ = 0;
  std::atomic<bool> failing_renews_{false};
  std::atomic<int> renews_{0};
};

class LeasesLockTest : public ::testing::Test {
 protected:
  // Two pools of 8 chunks of 4 pages; pool 0 lends through the gate.
  void SetUp() override {
    for (int p = 0; p < 2; ++p) {
      pools_.push_back(Tier::Create("gpu" + std::to_string(p), p, kPage, 32, kChunkPages).value());
    }
    gate_ = std::make_unique<GatedLender>(pools_[0]->lender());
    pools_[0]->SetLender(gate_.get());
    LeaseConfig config;
    config.page_bytes = kPage;
    config.chunk_bytes = kChunkPages * kPage;
    config.max_lease_bytes = 32 * kPage;
    leases_ = std::make_unique<Leases>(std::vector<Tier*>{pools_[0].get(), pools_[1].get()},
                                       std::vector<Tier*>{}, config);
  }

  static LeaseHolder Holder(const std::string& id, int pool = 0, pid_t pid = getpid(),
                            uint32_t uid = 1000) {
    LeaseHolder h;
    h.session_id = id;
    h.pool = pool;
    h.uid = uid;
    h.pid = pid;
    return h;
  }
  // The chunk ids a device lease of `pages` granted (an error fails the test).
  std::vector<uint64_t> Lease(const LeaseHolder& h, uint64_t pages) {
    v1::LeaseChunks request;
    v1::TierPages* w = request.add_want();
    w->set_tier(v1::TIER_DEVICE);
    w->set_pages(pages);
    DescriptorReply reply = leases_->Lease(h, request);
    EXPECT_TRUE(reply.status.ok()) << reply.status.message();
    std::vector<uint64_t> ids;
    for (const DescriptorPart& part : reply.parts) {
      v1::DescriptorResponse r;
      EXPECT_TRUE(r.ParseFromString(part.bytes));
      if (r.has_chunk()) ids.push_back(r.chunk().chunk_id());
    }
    return ids;
  }
  Status Return(const LeaseHolder& h, const std::vector<uint64_t>& ids) {
    v1::ReturnChunks request;
    for (uint64_t id : ids) request.add_chunk_ids(id);
    return leases_->Return(h, request).status;
  }
  // A child process that waits until killed: a rank the test kills (-1 when fork failed).
  static pid_t ForkWaitingChild() {
    const pid_t child = fork();
    if (child == 0) {
      pause();
      _exit(0);
    }
    return child;
  }
  // Runs `calls` on another thread while the gate holds a call; true when they finished within
  // 10 s. Opens the gate after (they finish then at the latest).
  bool FinishWhileGated(const std::function<void()>& calls) {
    auto done = std::async(std::launch::async, calls);
    const bool finished = done.wait_for(seconds(10)) == std::future_status::ready;
    gate_->Open();
    done.wait();
    return finished;
  }

  std::vector<std::unique_ptr<Tier>> pools_;
  std::unique_ptr<GatedLender> gate_;
  std::unique_ptr<Leases> leases_;  // last: it points into the tiers and the gate
};

// A lease whose chunks are being taken (a GPU's copy stream busy with a long daemon-copy stash)
// holds up no stats call, no return and no lease of another pool.
TEST_F(LeasesLockTest, ALeaseWaitingForItsLenderHoldsUpNoOtherCall) {
  const std::vector<uint64_t> r = Lease(Holder("r", 1), 8);
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(Lease(Holder("e", 1), 8).size(), 2u);
  gate_->CloseBeforeTake();
  std::vector<uint64_t> a;
  std::thread leasing([&] { a = Lease(Holder("a"), 16); });
  ASSERT_TRUE(gate_->WaitStopped());
  std::vector<uint64_t> b;
  Status returned;
  bool described = false;
  Leases::TierCounts counts;
  const bool finished = FinishWhileGated([&] {
    counts = leases_->Counts(pools_[1].get());
    std::vector<v1::LeaseStats> rows;
    ControlView view;
    described = leases_->Describe("a", &rows, &view);
    leases_->Sample();
    leases_->SessionEnded("e");
    b = Lease(Holder("b", 1), 8);
    returned = Return(Holder("r", 1), r);
  });
  leasing.join();
  ASSERT_TRUE(finished)
      << "stats, a session's end, a return or another pool's lease waited for pool 0's lender";
  EXPECT_EQ(counts.leased, 4u);
  EXPECT_TRUE(described);  // the holder leasing is there (it holds nothing yet)
  EXPECT_EQ(b.size(), 2u);
  EXPECT_TRUE(returned.ok()) << returned.message();
  EXPECT_EQ(a.size(), 4u);  // and the gated lease got what it asked for
  EXPECT_EQ(leases_->Counts(pools_[0].get()).leased, 4u);
  EXPECT_EQ(leases_->Counts(pools_[1].get()).leased, 2u);
  EXPECT_EQ(leases_->Counts(pools_[1].get()).orphaned, 2u);  // e's, its session ended
}

// A chunk given back is renewed without the lock: meanwhile it is in no ring and nobody's,
// counted as waiting for memory, and other leases of its pool go on without it.
TEST_F(LeasesLockTest, AReturnRenewingItsChunkHoldsUpNoLeaseAndLendsItToNobody) {
  const std::vector<uint64_t> a = Lease(Holder("a"), 8);
  ASSERT_EQ(a.size(), 2u);
  gate_->CloseBeforeRenew();
  Status returned;
  std::thread returning([&] { returned = Return(Holder("a"), {a[0]}); });
  ASSERT_TRUE(gate_->WaitStopped());
  Leases::TierCounts counts;
  std::vector<uint64_t> c;
  const bool finished = FinishWhileGated([&] {
    counts = leases_->Counts(pools_[0].get());
    c = Lease(Holder("c", 0, getpid(), 2000), 32);
  });
  returning.join();
  ASSERT_TRUE(finished) << "a lease waited for another session's chunk renew";
  EXPECT_TRUE(returned.ok()) << returned.message();
  EXPECT_EQ(counts.leased, 1u);
  EXPECT_EQ(counts.waiting, 1u);
  EXPECT_FALSE(c.empty());
  for (uint64_t id : c) EXPECT_NE(id, a[0]) << "a chunk being renewed was lent";
  const Leases::TierCounts after = leases_->Counts(pools_[0].get());
  EXPECT_EQ(after.waiting, 0u);
  EXPECT_EQ(after.leased, 1u + c.size());
  EXPECT_EQ(pools_[0]->chunks_free(), 8u - 1 - c.size());  // the renewed chunk is back
}

// A session's own return waits for its lease in flight: the books of one holder change in one
// call at a time, so nothing is lent or returned twice.
TEST_F(LeasesLockTest, ASessionsReturnWaitsForItsOwnLeaseInFlight) {
  const std::vector<uint64_t> a = Lease(Holder("a"), 4);
  ASSERT_EQ(a.size(), 1u);
  gate_->CloseBeforeTake();
  std::vector<uint64_t> grown;
  std::thread leasing([&] { grown = Lease(Holder("a"), 12); });
  ASSERT_TRUE(gate_->WaitStopped());
  auto returning = std::async(std::launch::async, [&] { return Return(Holder("a"), a); });
  const bool waited =
      returning.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout;
  gate_->Open();
  leasing.join();
  const Status returned = returning.get();
  EXPECT_TRUE(waited) << "the return ran inside the same session's lease";
  EXPECT_TRUE(returned.ok()) << returned.message();
  EXPECT_EQ(grown.size(), 2u);  // 12 pages: 1 held + 2 new
  EXPECT_EQ(leases_->Counts(pools_[0].get()).leased, 2u);
  EXPECT_EQ(pools_[0]->chunks_free(), 6u);
}

// A rank killed while its lease waits for the lender: the reaper waits for that lease, then
// takes back everything it handed, and drops the holder.
TEST_F(LeasesLockTest, ARankKilledMidLeaseGetsAllItsChunksReaped) {
  const pid_t child = ForkWaitingChild();
  ASSERT_GT(child, 0);
  gate_->CloseBeforeTake();
  std::vector<uint64_t> a;
  std::thread leasing([&] { a = Lease(Holder("a", 0, child), 16); });
  ASSERT_TRUE(gate_->WaitStopped());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the reaper sees the exit
  gate_->Open();
  leasing.join();
  EXPECT_EQ(a.size(), 4u);
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while ((leases_->holders() > 0 || pools_[0]->chunks_free() < 8) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(leases_->holders(), 0u);
  EXPECT_EQ(leases_->Counts(pools_[0].get()).leased, 0u);
  EXPECT_EQ(pools_[0]->chunks_free(), 8u);
}

// The reaper renews an exited rank's chunks without the lock and drops the holder after. A
// session of the same id made meanwhile (its stream ended, then a lease the rank sent before it
// died arrived) is not dropped with the chunks it holds: the next pass reaps it.
TEST_F(LeasesLockTest, AHolderMadeWhileTheReaperRenewsIsReapedNotDroppedWithItsChunks) {
  const pid_t child = ForkWaitingChild();
  ASSERT_GT(child, 0);
  ASSERT_EQ(Lease(Holder("a", 0, child), 8).size(), 2u);
  gate_->CloseBeforeRenew();
  kill(child, SIGKILL);  // not waited for yet: a zombie, so a pidfd of it can still be opened
  ASSERT_TRUE(gate_->WaitStopped());  // the reaper renews a's chunks
  leases_->SessionEnded("a");
  EXPECT_EQ(leases_->holders(), 0u);
  EXPECT_EQ(Lease(Holder("a", 0, child), 8).size(), 2u);
  leases_->SessionEnded("a");
  EXPECT_EQ(leases_->Counts(pools_[0].get()).orphaned, 2u);
  gate_->Open();
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while ((leases_->holders() > 0 || pools_[0]->chunks_free() < 8) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  waitpid(child, nullptr, 0);
  EXPECT_EQ(leases_->holders(), 0u);
  EXPECT_EQ(leases_->Counts(pools_[0].get()).orphaned, 0u);
  EXPECT_EQ(leases_->Counts(pools_[0].get()).leased, 0u);
  EXPECT_EQ(pools_[0]->chunks_free(), 8u);
  EXPECT_TRUE(pools_[0]->RingIsPermutation());
}

// A chunk that cannot get fresh memory is retried once a second, not in a loop: a daemon whose
// GPU stays full must not spin its reaper on the renews.
TEST_F(LeasesLockTest, AChunkThatCannotBeRenewedIsRetriedOnceASecond) {
  const std::vector<uint64_t> a = Lease(Holder("a"), 4);
  ASSERT_EQ(a.size(), 1u);
  gate_->FailRenews(true);
  ASSERT_TRUE(Return(Holder("a"), a).ok());
  EXPECT_EQ(leases_->renewing(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const int tries = gate_->renews();
  EXPECT_GE(tries, 2) << "the reaper never retried";
  EXPECT_LE(tries, 8) << "the reaper retried " << tries << " times in 2.5 s";
  EXPECT_EQ(pools_[0]->chunks_free(), 7u);  // never back in the ring with the old memory
  gate_->FailRenews(false);
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while ((leases_->renewing() > 0 || pools_[0]->chunks_free() < 8) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(leases_->renewing(), 0u);
  EXPECT_EQ(pools_[0]->chunks_free(), 8u);
}

}  // namespace
}  // namespace stash::daemon

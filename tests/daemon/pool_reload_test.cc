// The pool worker (daemon/copy/pool.cc) behind admission (the cuda backend's rules, with a fake
// executor): a failed or rejected reload never costs the
// stash. A fake executor stands in for client memory, so memory that fails to open and event
// counters in device memory can be made on a machine without a GPU; the copies themselves run
// through the real HostExecutor into a real host tier.
#include "daemon/copy/pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/copy_workers.h"
#include "common/host_event.h"
#include "daemon/copy/admit.h"
#include "daemon/copy/host_executor.h"
#include "daemon/sessions/session.h"
#include "daemon/tiers/tier.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kRowBytes = 512;
constexpr uint64_t kRows = 32;  // 16 KiB: 4 pages
constexpr uint64_t kBytes = kRowBytes * kRows;

// Client memory of the fake: plain heap bytes. `device` memory has no CPU address, as CUDA IPC
// memory on the cuda backend.
class HeapMemory final : public MappedMemory {
 public:
  HeapMemory(std::vector<uint8_t>* bytes, bool device)
      : MappedMemory(bytes->data(), device ? nullptr : bytes->data(), bytes->size()) {}
};

// The handle of a registration the fake opens by name: registrations go in as the cuda
// backend's 64-byte IPC handles (they need no descriptor), the name NUL-padded.
std::string Handle(const std::string& name) { return name + std::string(64 - name.size(), '\0'); }

// Opens registrations by handle: "fail" does not open (as a file that was unlinked, or a bad
// descriptor), "device:<name>" is device memory, anything else is host memory named so. The
// copies run on the real host executor.
class FakeExecutor final : public CopyExecutor {
 public:
  FakeExecutor(Tier* tier, CopyWorkers* workers) : host_(tier, nullptr, workers) {}

  // The bytes behind handle `name` (created on first use); the test writes and reads them.
  std::vector<uint8_t>& Bytes(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& bytes = memories_[name];
    if (bytes == nullptr) bytes = std::make_unique<std::vector<uint8_t>>(kBytes * 4);
    return *bytes;
  }

  Tier* device_tier() const override { return host_.device_tier(); }
  Tier* host_tier() const override { return nullptr; }
  StatusOr<std::unique_ptr<MappedMemory>> Open(const v1::RegisterMemory& reg,
                                               UniqueFd /*fd*/) override {
    const std::string name = reg.handle().substr(0, reg.handle().find('\0'));
    if (name == "fail") return FailedPreconditionError("no such memory (test)");
    const bool device = name.rfind("device:", 0) == 0;
    return std::unique_ptr<MappedMemory>(std::make_unique<HeapMemory>(&Bytes(name), device));
  }
  void Stash(const StashWork& work, Then then) override { host_.Stash(work, std::move(then)); }
  void Reload(const ReloadWork& work, Then then) override { host_.Reload(work, std::move(then)); }
  void Raise(const DoneSignal& done) override {
    if (done.memory != nullptr && done.memory->host() != nullptr) host_.Raise(done);
  }
  void Fence(Then then) override { host_.Fence(std::move(then)); }

 private:
  HostExecutor host_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<std::vector<uint8_t>>> memories_;
};

// Collects a session's answers.
class Answers final : public ResponseSink {
 public:
  void Send(v1::SessionResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    order_.push_back(response.request_id());
    answers_[response.request_id()] = std::move(response);
    cv_.notify_all();
  }
  // The request ids answered so far, in answer order.
  std::vector<uint64_t> Order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  // The answer to `request_id` (waits for it; the ctest timeout guards a hang).
  v1::SessionResponse Get(uint64_t request_id) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return answers_.count(request_id) != 0; });
    return answers_[request_id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, v1::SessionResponse> answers_;
  std::vector<uint64_t> order_;
};

// Memory ids the tests register.
enum Memory : uint64_t { kGood = 1, kOther = 2, kUnopened = 3, kDevice = 4, kEvents = 5 };

// Sets `event` to the counter at offset 0 of `memory`.
void SetEvent(v1::EventRef* event, uint64_t memory, uint64_t value) {
  event->mutable_counter()->set_memory_id(memory);
  event->mutable_counter()->set_offset(0);
  event->set_value(value);
}

class PoolReload : public ::testing::Test {
 protected:
  PoolReload() {
    tier_ = std::move(Tier::Create("gpu0", 0, kPage, 64)).value();
    auto executor = std::make_unique<FakeExecutor>(tier_.get(), &workers_);
    executor_ = executor.get();
    pool_ = std::make_unique<Pool>(0, std::move(executor), &counters_);
    session_ = std::make_shared<Session>(SessionInfo{}, &answers_, nullptr);
    Register(kGood, "good");
    Register(kOther, "other");
    Register(kDevice, "device:counters");
    Register(kEvents, "events");
  }
  ~PoolReload() override { pool_->Stop(); }

  // Admits and queues `r` as the daemon does; returns its answer.
  v1::SessionResponse Run(v1::SessionRequest r) { return answers_.Get(Submit(r, session_)); }

  // Runs `r` against memory kUnopened whose registration fails in the pool. A failed
  // registration frees its id, so only requests admitted before it ran see the failed memory:
  // both queue behind a stash of 0 rows held on its ready event, released together.
  v1::SessionResponse RunBehindAFailedRegistration(v1::SessionRequest r) {
    uint64_t& gate = *reinterpret_cast<uint64_t*>(executor_->Bytes("events").data() + 64);
    v1::SessionRequest held;
    held.mutable_stash()->set_ticket(0x6a7e0000 + gate);
    held.mutable_stash()->mutable_source()->set_memory_id(kGood);
    held.mutable_stash()->set_row_bytes(kRowBytes);
    held.mutable_stash()->set_max_rows(kRows);
    held.mutable_stash()->mutable_count()->set_value(0);
    SetEvent(held.mutable_stash()->mutable_ready(), kEvents, gate + 1);
    held.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(64);
    const uint64_t held_id = Submit(held, session_);
    v1::SessionRequest reg;
    v1::RegisterMemory* m = reg.mutable_register_memory();
    m->set_memory_id(kUnopened);
    m->set_kind(v1::MEMORY_KIND_CUDA_IPC);
    m->set_handle(Handle("fail"));
    m->set_bytes(kBytes * 4);
    const uint64_t reg_id = Submit(reg, session_);
    const uint64_t id = Submit(r, session_);
    EventSignal(&gate, gate + 1);
    EXPECT_EQ(answers_.Get(held_id).code(), 0);
    EXPECT_NE(answers_.Get(reg_id).code(), 0);
    v1::SessionRequest release;
    release.mutable_release()->set_ticket(held.stash().ticket());
    EXPECT_EQ(Run(release).code(), 0);
    return answers_.Get(id);
  }

  // Admits and queues `r` for `session` without waiting; returns its request id (an admission
  // error is answered at once, as the daemon does).
  uint64_t Submit(v1::SessionRequest r, const std::shared_ptr<Session>& session) {
    r.set_request_id(++next_id_);
    const uint64_t id = r.request_id();
    const Status admitted = AdmitRequest(r, *session, limits_);
    if (!admitted.ok()) {
      v1::SessionResponse answer;
      answer.set_request_id(id);
      answer.set_code(static_cast<int>(admitted.code()));
      answer.set_message(admitted.message());
      session->Send(answer);
      return id;
    }
    pool_->Enqueue(session, std::move(r), std::chrono::steady_clock::now());
    return id;
  }

  void Register(uint64_t id, const std::string& handle) {
    v1::SessionRequest r;
    v1::RegisterMemory* m = r.mutable_register_memory();
    m->set_memory_id(id);
    m->set_kind(v1::MEMORY_KIND_CUDA_IPC);
    m->set_handle(Handle(handle));
    m->set_bytes(kBytes * 4);
    Run(r);  // "fail" is answered with its open error; requests naming it fail later
  }

  // Stashes all rows of "good" under `ticket`; expects it placed.
  void StashGood(uint64_t ticket, uint8_t seed) {
    std::vector<uint8_t>& src = executor_->Bytes("good");
    for (uint64_t i = 0; i < kBytes; ++i) src[i] = static_cast<uint8_t>(seed + i * 7);
    v1::SessionRequest r;
    v1::Stash* s = r.mutable_stash();
    s->set_ticket(ticket);
    s->mutable_source()->set_memory_id(kGood);
    s->set_row_bytes(kRowBytes);
    s->set_max_rows(kRows);
    s->mutable_count()->set_value(kRows);
    const v1::SessionResponse answer = Run(r);
    ASSERT_EQ(answer.code(), 0) << answer.message();
    ASSERT_EQ(answer.stash().tier(), v1::TIER_DEVICE);
  }

  static v1::SessionRequest Reload(uint64_t ticket, uint64_t memory, uint64_t offset = 0) {
    v1::SessionRequest r;
    r.mutable_reload()->set_ticket(ticket);
    r.mutable_reload()->mutable_destination()->set_memory_id(memory);
    r.mutable_reload()->mutable_destination()->set_offset(offset);
    return r;
  }
  static v1::SessionRequest Release(uint64_t ticket) {
    v1::SessionRequest r;
    r.mutable_release()->set_ticket(ticket);
    return r;
  }
  // Reloads `ticket` into "other" and checks the rows stashed with `seed` came back.
  void ExpectReloadsIntact(uint64_t ticket, uint8_t seed) {
    std::vector<uint8_t>& dst = executor_->Bytes("other");
    std::memset(dst.data(), 0xee, kBytes);
    const v1::SessionResponse answer = Run(Reload(ticket, kOther));
    ASSERT_EQ(answer.code(), 0) << answer.message();
    EXPECT_EQ(answer.reload().rows(), kRows);
    for (uint64_t i = 0; i < kBytes; ++i) {
      ASSERT_EQ(dst[i], static_cast<uint8_t>(seed + i * 7)) << "byte " << i;
    }
  }

  uint64_t PagesUsed() const { return tier_->Snapshot().pages_used; }

  // Ends the session and drains the worker: every page must be back.
  void CloseAndDrain() {
    pool_->CloseSession(session_);
    pool_->Stop();
  }

  CopyWorkers workers_{1};
  std::unique_ptr<Tier> tier_;
  DaemonCounters counters_;
  FakeExecutor* executor_ = nullptr;  // owned by pool_
  std::unique_ptr<Pool> pool_;
  Answers answers_;
  std::shared_ptr<Session> session_;
  AdmitLimits limits_{stash::v1::BACKEND_CUDA};  // registrations by handle (see Handle)
  uint64_t next_id_ = 100;
};

// Each way a reload can fail on the worker, after admission: the answer says what went wrong
// and that the stash is kept; the same ticket then reloads byte-exact, and can be reused.
struct FailedReload {
  const char* name;
  void (*make)(v1::SessionRequest& reload);
  const char* says;
  bool unopened = true;  // names memory whose registration failed
};

const FailedReload kFailedReloads[] = {
    {"DestinationThatFailedToOpen",
     [](v1::SessionRequest& r) {
       r.mutable_reload()->mutable_destination()->set_memory_id(kUnopened);
     },
     "could not be opened"},
    {"ReadyEventInMemoryThatFailedToOpen",
     [](v1::SessionRequest& r) { SetEvent(r.mutable_reload()->mutable_ready(), kUnopened, 1); },
     "could not be opened"},
    {"DoneEventInMemoryThatFailedToOpen",
     [](v1::SessionRequest& r) { SetEvent(r.mutable_reload()->mutable_done(), kUnopened, 1); },
     "could not be opened"},
    {"ReadyEventInDeviceMemory",
     [](v1::SessionRequest& r) { SetEvent(r.mutable_reload()->mutable_ready(), kDevice, 1); },
     "device memory", false},
    {"DoneEventInDeviceMemory",
     [](v1::SessionRequest& r) { SetEvent(r.mutable_reload()->mutable_done(), kDevice, 1); },
     "device memory", false},
};

TEST_F(PoolReload, FailedReloadKeepsTheStashForEveryWayItCanFail) {
  uint64_t ticket = 0x7000;
  for (const FailedReload& way : kFailedReloads) {
    SCOPED_TRACE(way.name);
    ++ticket;
    StashGood(ticket, static_cast<uint8_t>(ticket));
    const uint64_t held = PagesUsed();
    ASSERT_GT(held, 0u);

    v1::SessionRequest bad = Reload(ticket, kOther);
    way.make(bad);
    const v1::SessionResponse failed = way.unopened ? RunBehindAFailedRegistration(bad) : Run(bad);
    EXPECT_NE(failed.code(), 0);
    EXPECT_THAT(failed.message(), HasSubstr(way.says));
    EXPECT_THAT(failed.message(), HasSubstr("is kept"));
    EXPECT_EQ(PagesUsed(), held) << "the failed reload returned the pages";

    ExpectReloadsIntact(ticket, static_cast<uint8_t>(ticket));
    EXPECT_EQ(PagesUsed(), 0u);
    // The ticket is free again once the reload took it.
    StashGood(ticket, 3);
    ASSERT_EQ(Run(Release(ticket)).code(), 0);
  }
  EXPECT_EQ(PagesUsed(), 0u);
}

TEST_F(PoolReload, FailedReloadThenReleaseReturnsThePages) {
  StashGood(0x51, 9);
  ASSERT_NE(RunBehindAFailedRegistration(Reload(0x51, kUnopened)).code(), 0);
  const v1::SessionResponse released = Run(Release(0x51));
  ASSERT_EQ(released.code(), 0) << released.message();
  EXPECT_EQ(released.release().pages(), kBytes / kPage);
  EXPECT_EQ(PagesUsed(), 0u);
}

// The reported leak: fail a reload, reuse the ticket, four rounds, close. Reusing a ticket whose
// stash is still held is refused, and every page returns at the end of the session.
TEST_F(PoolReload, ReusingATicketAfterAFailedReloadLeaksNothing) {
  constexpr uint64_t kTicket = 0xabc;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    StashGood(kTicket, static_cast<uint8_t>(round));
    ASSERT_NE(Run(Reload(kTicket, kUnopened)).code(), 0);
    v1::SessionRequest again;
    again.mutable_stash()->set_ticket(kTicket);
    again.mutable_stash()->mutable_source()->set_memory_id(kGood);
    again.mutable_stash()->set_row_bytes(kRowBytes);
    again.mutable_stash()->set_max_rows(kRows);
    again.mutable_stash()->mutable_count()->set_value(kRows);
    const v1::SessionResponse reused = Run(again);
    EXPECT_EQ(reused.code(), static_cast<int>(StatusCode::kAlreadyExists)) << reused.message();
    ExpectReloadsIntact(kTicket, static_cast<uint8_t>(round));
  }
  StashGood(kTicket, 1);
  ASSERT_NE(Run(Reload(kTicket, kUnopened)).code(), 0);
  EXPECT_GT(PagesUsed(), 0u);
  CloseAndDrain();
  EXPECT_EQ(PagesUsed(), 0u);
}

TEST_F(PoolReload, RejectedReloadsKeepTheStash) {
  StashGood(0x77, 5);
  // Out of range: admission refuses it before it is queued.
  const v1::SessionResponse out_of_range = Run(Reload(0x77, kOther, kBytes * 4 - 100));
  EXPECT_EQ(out_of_range.code(), static_cast<int>(StatusCode::kInvalidArgument));
  // Unknown memory and unknown ticket.
  EXPECT_EQ(Run(Reload(0x77, 99)).code(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(Run(Reload(0x78, kOther)).code(), static_cast<int>(StatusCode::kNotFound));
  ExpectReloadsIntact(0x77, 5);
  EXPECT_EQ(PagesUsed(), 0u);
}

// A second reload queued behind one that will fail is refused at admission (the first still
// holds the ticket), and the ticket is live again for the next one after the failure.
TEST_F(PoolReload, TicketIsLiveAgainOnceItsFailedReloadIsAnswered) {
  StashGood(0x99, 8);
  v1::SessionRequest first = Reload(0x99, kOther);
  SetEvent(first.mutable_reload()->mutable_ready(), kEvents, 1);  // held back
  SetEvent(first.mutable_reload()->mutable_done(), kDevice, 1);   // fails in the pool
  first.set_request_id(++next_id_);
  ASSERT_TRUE(AdmitRequest(first, *session_, limits_).ok());
  const uint64_t first_id = first.request_id();
  pool_->Enqueue(session_, std::move(first), std::chrono::steady_clock::now());
  const v1::SessionResponse second = Run(Reload(0x99, kOther));
  EXPECT_EQ(second.code(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_THAT(second.message(), HasSubstr("queued"));
  EventSignal(reinterpret_cast<uint64_t*>(executor_->Bytes("events").data()), 1);  // ready
  EXPECT_NE(answers_.Get(first_id).code(), 0);
  ExpectReloadsIntact(0x99, 8);
}

// One session's head waits on a ready event nobody has signalled yet: another session's work
// goes on meanwhile, and the waiting session's requests then run in their order.
TEST_F(PoolReload, AWaitingSessionHoldsUpNoOtherAndKeepsItsOwnOrder) {
  Answers other_answers;
  auto other = std::make_shared<Session>(SessionInfo{}, &other_answers, nullptr);
  v1::SessionRequest reg;
  reg.mutable_register_memory()->set_memory_id(kGood);
  reg.mutable_register_memory()->set_kind(v1::MEMORY_KIND_CUDA_IPC);
  reg.mutable_register_memory()->set_handle(Handle("other-session"));
  reg.mutable_register_memory()->set_bytes(kBytes * 4);
  ASSERT_EQ(other_answers.Get(Submit(reg, other)).code(), 0);

  auto stash = [](uint64_t ticket, bool held) {
    v1::SessionRequest r;
    v1::Stash* s = r.mutable_stash();
    s->set_ticket(ticket);
    s->mutable_source()->set_memory_id(kGood);
    s->set_row_bytes(kRowBytes);
    s->set_max_rows(kRows);
    s->mutable_count()->set_value(kRows);
    if (held) SetEvent(s->mutable_ready(), kEvents, 1);
    return r;
  };
  const uint64_t held = Submit(stash(0x1, true), session_);
  const uint64_t behind = Submit(stash(0x2, false), session_);  // ready, but queued behind
  for (uint64_t t = 0x10; t < 0x14; ++t) {
    const v1::SessionResponse done = other_answers.Get(Submit(stash(t, false), other));
    ASSERT_EQ(done.code(), 0) << done.message();
    ASSERT_EQ(other_answers.Get(Submit(Release(t), other)).code(), 0);
  }
  EXPECT_TRUE(answers_.Order().empty() || answers_.Order().back() < held);  // nothing of ours
  EventSignal(reinterpret_cast<uint64_t*>(executor_->Bytes("events").data()), 1);
  EXPECT_EQ(answers_.Get(held).code(), 0);
  EXPECT_EQ(answers_.Get(behind).code(), 0);
  const std::vector<uint64_t> order = answers_.Order();
  ASSERT_GE(order.size(), 2u);
  EXPECT_EQ(order[order.size() - 2], held);
  EXPECT_EQ(order.back(), behind);
  pool_->CloseSession(other);
}

}  // namespace
}  // namespace stash::daemon

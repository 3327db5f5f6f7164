// Request admission (daemon/copy/admit.cc): every malformed or out-of-range request is answered
// with its status and a message that says what to change, and a rejected request changes nothing.
#include "daemon/copy/admit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "daemon/protocol/enum_choices.h"
#include "daemon/sessions/session.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMem = 1;  // registered in every test
constexpr uint64_t kMemBytes = 1 << 20;
constexpr uint64_t kTicket = 0x5eed5eed5eed5eedULL;

v1::SessionRequest Register(uint64_t rid, uint64_t memory_id, uint64_t bytes,
                            v1::MemoryKind kind = v1::MEMORY_KIND_HOST_FD,
                            const std::string& handle = "") {
  v1::SessionRequest r;
  r.set_request_id(rid);
  v1::RegisterMemory* m = r.mutable_register_memory();
  m->set_memory_id(memory_id);
  m->set_kind(kind);
  m->set_handle(handle);
  m->set_bytes(bytes);
  return r;
}

v1::SessionRequest Unregister(uint64_t rid, uint64_t memory_id) {
  v1::SessionRequest r;
  r.set_request_id(rid);
  r.mutable_unregister_memory()->set_memory_id(memory_id);
  return r;
}

// A stash of `max_rows` rows of `row_bytes` at `offset` of `memory_id`, all rows valid.
v1::SessionRequest Stash(uint64_t rid, uint64_t ticket, uint64_t memory_id = kMem,
                         uint64_t offset = 0, uint64_t row_bytes = 64, uint64_t max_rows = 16) {
  v1::SessionRequest r;
  r.set_request_id(rid);
  v1::Stash* s = r.mutable_stash();
  s->set_ticket(ticket);
  s->mutable_source()->set_memory_id(memory_id);
  s->mutable_source()->set_offset(offset);
  s->set_row_bytes(row_bytes);
  s->set_max_rows(max_rows);
  s->mutable_count()->set_value(max_rows);
  return r;
}

v1::SessionRequest Reload(uint64_t rid, uint64_t ticket, uint64_t memory_id = kMem,
                          uint64_t offset = 0) {
  v1::SessionRequest r;
  r.set_request_id(rid);
  v1::Reload* l = r.mutable_reload();
  l->set_ticket(ticket);
  l->mutable_destination()->set_memory_id(memory_id);
  l->mutable_destination()->set_offset(offset);
  return r;
}

v1::SessionRequest Release(uint64_t rid, uint64_t ticket) {
  v1::SessionRequest r;
  r.set_request_id(rid);
  r.mutable_release()->set_ticket(ticket);
  return r;
}

v1::SessionRequest BeginStep(uint64_t rid) {
  v1::SessionRequest r;
  r.set_request_id(rid);
  r.mutable_begin_step()->set_step(1);
  return r;
}

v1::Hello HostHello(int32_t device = 0) {
  v1::Hello h;
  h.set_backend(v1::BACKEND_HOST);
  h.set_device(device);
  h.set_rank(0);
  return h;
}

class Admit : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Check(Register(1, kMem, kMemBytes)).ok()); }

  Status Check(const v1::SessionRequest& request) {
    return AdmitRequest(request, session_, limits_);
  }

  // Live and free to reload or release: stashed, and no queued reload or release claimed it.
  bool TicketLive(uint64_t ticket) {
    MutexLock lock(&session_.mu());
    auto it = session_.live_tickets().find(ticket);
    return it != session_.live_tickets().end() && !it->second.claimed;
  }
  bool MemoryDeclared(uint64_t id) {
    MutexLock lock(&session_.mu());
    return session_.declared_memories().contains(id);
  }

  AdmitLimits limits_;  // host backend
  Session session_{SessionInfo{}, nullptr, nullptr};
};

// Asserts the status code and that the message carries `word` (what to change).
#define EXPECT_REJECTED(expr, status_code, word)                    \
  do {                                                              \
    const Status s_ = (expr);                                       \
    EXPECT_EQ(s_.code(), StatusCode::status_code) << s_.ToString(); \
    EXPECT_THAT(s_.message(), HasSubstr(word)) << s_.ToString();    \
  } while (0)

// ---- Any request ------------------------------------------------------------------------------

TEST_F(Admit, RequestIdZeroIsInvalidArgument) {
  EXPECT_REJECTED(Check(Stash(0, kTicket)), kInvalidArgument, "request_id");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, SecondHelloIsFailedPrecondition) {
  v1::SessionRequest r;
  r.set_request_id(2);
  *r.mutable_hello() = HostHello();
  EXPECT_REJECTED(Check(r), kFailedPrecondition, "Hello");
}

TEST_F(Admit, RequestWithoutKindIsInvalidArgument) {
  v1::SessionRequest r;
  r.set_request_id(2);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "stash");
}

TEST_F(Admit, TooManyInFlightIsResourceExhausted) {
  limits_.max_inflight = 8;
  session_.counters().inflight = 8;
  EXPECT_REJECTED(Check(Stash(2, kTicket)), kResourceExhausted, "wait for completions");
  EXPECT_FALSE(TicketLive(kTicket));
  session_.counters().inflight = 7;
  EXPECT_TRUE(Check(Stash(3, kTicket)).ok());
}

// ---- RegisterMemory / UnregisterMemory ---------------------------------------------------------

TEST_F(Admit, RegisterWithMemoryIdZeroIsInvalidArgument) {
  EXPECT_REJECTED(Check(Register(2, 0, 4096)), kInvalidArgument, "memory_id");
  EXPECT_FALSE(MemoryDeclared(0));
}

TEST_F(Admit, RegisterOfZeroBytesIsInvalidArgument) {
  EXPECT_REJECTED(Check(Register(2, 2, 0)), kInvalidArgument, "bytes");
  EXPECT_FALSE(MemoryDeclared(2));
}

TEST_F(Admit, RegisterOfHostMemoryWithAHandleIsInvalidArgumentAndNeverEchoesIt) {
  const std::string handle = "/stashd-1234-" + std::string(4 << 20, 'x');
  const Status s =
      AdmitRequest(Register(2, 2, 4096, v1::MEMORY_KIND_HOST_FD, handle), session_, limits_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("handle empty"));
  EXPECT_LT(s.message().size(), 1024U);
  EXPECT_FALSE(MemoryDeclared(2));
}

TEST_F(Admit, RegisterOfAShmNameIsRefusedWithWhatReplacedIt) {
  // Kind 1 was MEMORY_KIND_HOST_SHM: a name any client could use to open another's memory.
  const Status s = AdmitRequest(
      Register(2, 2, 4096, static_cast<v1::MemoryKind>(1), "/stashd-99-victim"), session_, limits_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("MEMORY_KIND_HOST_FD"));
  EXPECT_THAT(s.message(), Not(HasSubstr("victim")));
  EXPECT_FALSE(MemoryDeclared(2));
}

TEST_F(Admit, RegisterOfTheOtherBackendsMemoryIsFailedPrecondition) {
  EXPECT_REJECTED(Check(Register(2, 2, 4096, v1::MEMORY_KIND_CUDA_IPC, std::string(64, 'h'))),
                  kFailedPrecondition, "MEMORY_KIND_HOST_FD");
  EXPECT_FALSE(MemoryDeclared(2));
}

TEST_F(Admit, RegistrationsAreBoundedInBytes) {
  EXPECT_REJECTED(Check(Register(2, 2, limits_.max_memory_bytes + 1)), kInvalidArgument,
                  "register smaller buffers");
}

// Sessions of two users against the daemon-wide budgets (daemon/limits/fair_share.h).
struct TwoUsers {
  TwoUsers(uint64_t max_memories, uint64_t max_bytes)
      : memories({"registered allocations", max_memories, 1, 0, "unregister some first"}),
        bytes(
            {"bytes of registered client memory", max_bytes, 1 << 20, 0, "unregister some first"}),
        first(Info(1000), nullptr, nullptr, {&this->memories, &this->bytes, nullptr}),
        second(Info(1000), nullptr, nullptr, {&this->memories, &this->bytes, nullptr}),
        other(Info(2000), nullptr, nullptr, {&this->memories, &this->bytes, nullptr}) {}
  static SessionInfo Info(uint32_t uid) {
    SessionInfo info;
    info.uid = uid;
    return info;
  }
  FairShare memories;
  FairShare bytes;
  Session first;   // uid 1000
  Session second;  // uid 1000 too
  Session other;   // uid 2000
};

TEST(AdmitShared, BytesOverAllSessionsLeaveAnotherUsersFirstSessionItsShare) {
  AdmitLimits limits;
  TwoUsers users(100, 4 << 20);
  EXPECT_TRUE(AdmitRequest(Register(1, 1, 2 << 20), users.first, limits).ok());
  EXPECT_TRUE(AdmitRequest(Register(2, 2, 1 << 20), users.second, limits).ok());
  // 3 MiB of 4 MiB in use by uid 1000: one more MiB would leave less than the 1 MiB kept for
  // another user's first session.
  Status s = AdmitRequest(Register(3, 3, 1 << 20), users.second, limits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("bytes of registered client memory"));
  EXPECT_THAT(s.message(), HasSubstr("uid 1000"));
  EXPECT_THAT(s.message(), HasSubstr("another user's first session"));
  EXPECT_THAT(s.message(), HasSubstr("unregister some first"));
  // The other user's first session gets its share all the same.
  EXPECT_TRUE(AdmitRequest(Register(4, 4, 1 << 20), users.other, limits).ok());
  EXPECT_EQ(users.bytes.used(), 4U << 20);
  // A refusal took nothing; an unregistration gives back.
  EXPECT_EQ(users.memories.used(), 3U);
  EXPECT_TRUE(AdmitRequest(Unregister(5, 1), users.first, limits).ok());
  EXPECT_EQ(users.bytes.Held(1000), 1U << 20);
  EXPECT_TRUE(AdmitRequest(Register(6, 3, 1 << 20), users.second, limits).ok());
}

TEST(AdmitShared, RegistrationsOverAllSessionsLeaveAnotherUsersFirstSessionItsShare) {
  AdmitLimits limits;
  TwoUsers users(4, 1ULL << 40);
  EXPECT_TRUE(AdmitRequest(Register(1, 1, 4096), users.first, limits).ok());
  EXPECT_TRUE(AdmitRequest(Register(2, 2, 4096), users.first, limits).ok());
  EXPECT_TRUE(AdmitRequest(Register(3, 3, 4096), users.second, limits).ok());
  const Status s = AdmitRequest(Register(4, 4, 4096), users.second, limits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("registered allocations"));
  EXPECT_EQ(users.bytes.used(), 3U * 4096);  // the byte share taken for it was given back
  EXPECT_TRUE(AdmitRequest(Register(5, 5, 4096), users.other, limits).ok());
  EXPECT_TRUE(AdmitRequest(Unregister(6, 3), users.second, limits).ok());
  EXPECT_EQ(users.memories.Held(1000), 2U);
}

TEST(AdmitCuda, HostMemoryOnTheCudaBackendHoldsOnlyCounters) {
  Session session(SessionInfo{}, nullptr, nullptr);
  AdmitLimits limits;
  limits.backend = v1::BACKEND_CUDA;
  const Status s =
      AdmitRequest(Register(1, 1, limits.max_counter_memory_bytes + 1), session, limits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("only counters"));
}

TEST(AdmitCuda, TheCudaBackendTakesDeviceAndHostMemoryButNotUnspecified) {
  Session session(SessionInfo{}, nullptr, nullptr);
  AdmitLimits limits;
  limits.backend = v1::BACKEND_CUDA;
  EXPECT_TRUE(AdmitRequest(Register(1, 1, 4096), session, limits).ok());  // event counters
  EXPECT_TRUE(AdmitRequest(Register(2, 2, 4096, v1::MEMORY_KIND_CUDA_IPC, std::string(64, 'h')),
                           session, limits)
                  .ok());
  Status s = AdmitRequest(Register(3, 3, 4096, v1::MEMORY_KIND_UNSPECIFIED), session, limits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("MEMORY_KIND_CUDA_IPC or MEMORY_KIND_HOST_FD"));
  s = AdmitRequest(Register(4, 4, 4096, v1::MEMORY_KIND_CUDA_IPC, std::string(63, 'h')), session,
                   limits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("64 bytes"));
}

TEST_F(Admit, UnknownMemoryKindIsInvalidArgumentNamingTheKnownOnes) {
  for (int kind : {0, 4, 99, -1}) {
    const Status s = Check(Register(2, 2, 4096, static_cast<v1::MemoryKind>(kind)));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << kind << ": " << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("memory kind " + std::to_string(kind) +
                                       " is not a known MemoryKind: use MEMORY_KIND_CUDA_IPC or "
                                       "MEMORY_KIND_HOST_FD"));
    EXPECT_FALSE(MemoryDeclared(2));
  }
}

TEST(EnumChoices, NamesEveryValueButTheUnspecifiedOne) {
  EXPECT_EQ(EnumChoices<v1::Backend>(), "BACKEND_HOST or BACKEND_CUDA");
  EXPECT_EQ(EnumChoices<v1::Tier>(), "TIER_DEVICE, TIER_HOST, TIER_OVERFLOW or TIER_PEER");
  EXPECT_EQ(UnknownEnumValue<v1::Backend>("backend", 99),
            "backend 99 is not a known Backend: use BACKEND_HOST or BACKEND_CUDA");
}

TEST_F(Admit, StashNameOverTheLimitIsInvalidArgumentWithoutEchoingIt) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->set_name(std::string(kMaxTextBytes, 'n'));
  ASSERT_TRUE(Check(r).ok());
  r = Stash(3, kTicket + 1);
  r.mutable_stash()->set_name(std::string(kMaxTextBytes + 1, 'n'));
  const Status s = Check(r);
  EXPECT_REJECTED(s, kInvalidArgument, "Stash.name is 257 bytes, over the limit of 256 bytes");
  EXPECT_THAT(s.message(), Not(HasSubstr("nnn")));
  EXPECT_FALSE(TicketLive(kTicket + 1));
}

TEST_F(Admit, RegisterOfAnIdInUseIsAlreadyExistsAndKeepsTheFirst) {
  EXPECT_REJECTED(Check(Register(2, kMem, 64)), kAlreadyExists, "new memory_id");
  // The first registration (1 MiB) still stands: a stash using all of it is admitted.
  EXPECT_TRUE(Check(Stash(3, kTicket, kMem, 0, 1024, 1024)).ok());
}

TEST_F(Admit, RegisterBeyondTheLimitIsResourceExhausted) {
  limits_.max_memories = 2;
  EXPECT_TRUE(Check(Register(2, 2, 4096)).ok());
  EXPECT_REJECTED(Check(Register(3, 3, 4096)), kResourceExhausted, "unregister");
  EXPECT_FALSE(MemoryDeclared(3));
  EXPECT_TRUE(Check(Unregister(4, 2)).ok());
  EXPECT_TRUE(Check(Register(5, 3, 4096)).ok());
}

TEST_F(Admit, UnregisterOfUnknownMemoryIsNotFound) {
  EXPECT_REJECTED(Check(Unregister(2, 42)), kNotFound, "not registered");
  EXPECT_TRUE(MemoryDeclared(kMem));
}

TEST_F(Admit, UnregisteredMemoryCannotBeNamedAgain) {
  EXPECT_TRUE(Check(Unregister(2, kMem)).ok());
  EXPECT_REJECTED(Check(Stash(3, kTicket)), kNotFound, "RegisterMemory");
  EXPECT_REJECTED(Check(Unregister(4, kMem)), kNotFound, "not registered");
}

// ---- Stash ------------------------------------------------------------------------------------

TEST_F(Admit, StashWithTicketZeroIsInvalidArgument) {
  EXPECT_REJECTED(Check(Stash(2, 0)), kInvalidArgument, "ticket");
  EXPECT_FALSE(TicketLive(0));
}

TEST_F(Admit, StashWithALiveTicketIsAlreadyExists) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  EXPECT_REJECTED(Check(Stash(3, kTicket)), kAlreadyExists, "fresh ticket");
  EXPECT_TRUE(TicketLive(kTicket));
}

// A queued reload or release claims the ticket; the pool worker forgets it once it took the
// pages (ForgetTicket), and only then may a stash reuse it.
TEST_F(Admit, TicketIsReusableOnceReloadedOrReleased) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  ASSERT_TRUE(Check(Reload(3, kTicket)).ok());
  EXPECT_REJECTED(Check(Stash(4, kTicket)), kAlreadyExists, "still queued");
  session_.ForgetTicket(kTicket);  // the worker took the pages
  EXPECT_TRUE(Check(Stash(4, kTicket)).ok());
  ASSERT_TRUE(Check(Release(5, kTicket)).ok());
  session_.ForgetTicket(kTicket);
  EXPECT_TRUE(Check(Stash(6, kTicket)).ok());
}

// The worker could not run the reload (its memory did not open): the stash is live again.
TEST_F(Admit, TicketIsLiveAgainAfterItsReloadFailed) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  ASSERT_TRUE(Check(Reload(3, kTicket)).ok());
  session_.UnclaimTicket(kTicket);
  EXPECT_TRUE(TicketLive(kTicket));
  EXPECT_TRUE(Check(Reload(4, kTicket)).ok());
  session_.UnclaimTicket(kTicket);
  EXPECT_TRUE(Check(Release(5, kTicket)).ok());
}

TEST_F(Admit, StashWithZeroRowBytesIsInvalidArgument) {
  EXPECT_REJECTED(Check(Stash(2, kTicket, kMem, 0, 0, 16)), kInvalidArgument, "row_bytes");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithZeroMaxRowsIsInvalidArgument) {
  EXPECT_REJECTED(Check(Stash(2, kTicket, kMem, 0, 64, 0)), kInvalidArgument, "max_rows");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWhoseSizeOverflows64BitsIsInvalidArgument) {
  EXPECT_REJECTED(Check(Stash(2, kTicket, kMem, 0, 1ULL << 33, 1ULL << 31)), kInvalidArgument,
                  "overflows");
  EXPECT_REJECTED(Check(Stash(3, kTicket, kMem, 0, UINT64_MAX, 2)), kInvalidArgument, "overflows");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithoutSourceIsInvalidArgument) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->clear_source();
  EXPECT_REJECTED(Check(r), kInvalidArgument, "source");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashFromUnknownMemoryIsNotFound) {
  EXPECT_REJECTED(Check(Stash(2, kTicket, 42)), kNotFound, "RegisterMemory");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashSourcePastTheEndIsInvalidArgument) {
  // Exactly the whole memory is fine; one byte more is not, whether by offset or by size.
  EXPECT_TRUE(Check(Stash(2, 1, kMem, 0, 1024, kMemBytes / 1024)).ok());
  EXPECT_TRUE(Check(Stash(3, 2, kMem, kMemBytes - 64, 64, 1)).ok());
  EXPECT_REJECTED(Check(Stash(4, kTicket, kMem, 1, 1024, kMemBytes / 1024)), kInvalidArgument,
                  "past the end");
  EXPECT_REJECTED(Check(Stash(5, kTicket, kMem, 0, 1024, kMemBytes / 1024 + 1)), kInvalidArgument,
                  "past the end");
  EXPECT_REJECTED(Check(Stash(6, kTicket, kMem, kMemBytes + 1, 1, 1)), kInvalidArgument,
                  "past the end");
  // offset + size would wrap around 2^64: still past the end.
  EXPECT_REJECTED(Check(Stash(7, kTicket, kMem, 8, UINT64_MAX - 4, 1)), kInvalidArgument,
                  "past the end");
  EXPECT_REJECTED(Check(Stash(8, kTicket, kMem, UINT64_MAX - 7, 16, 1)), kInvalidArgument,
                  "past the end");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithCountUnsetIsInvalidArgument) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->clear_count();
  EXPECT_REJECTED(Check(r), kInvalidArgument, "count must be set");
  r.mutable_stash()->mutable_count()->set_divisor(32);  // a divisor alone is no count
  EXPECT_REJECTED(Check(r), kInvalidArgument, "count must be set");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithDeviceCountReferenceIsAdmitted) {
  v1::SessionRequest r = Stash(2, kTicket, kMem, 0, 64, 16);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_memory_id(kMem);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_offset(kMemBytes - 8);
  EXPECT_TRUE(Check(r).ok());
}

TEST_F(Admit, StashWithUnalignedCountReferenceIsInvalidArgument) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_memory_id(kMem);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_offset(4096 + 4);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "8-byte aligned");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithCountReferencePastTheEndIsInvalidArgument) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_memory_id(kMem);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_offset(kMemBytes);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "past the end");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithCountReferenceInUnknownMemoryIsNotFound) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_count()->mutable_reference()->set_memory_id(42);
  EXPECT_REJECTED(Check(r), kNotFound, "RegisterMemory");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithTooLargeDivisorIsInvalidArgument) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_count()->set_divisor((1u << 20) + 1);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "divisor");
  EXPECT_FALSE(TicketLive(kTicket));
  r.mutable_stash()->mutable_count()->set_divisor(32);  // MXFP8 scale_inv
  EXPECT_TRUE(Check(r).ok());
}

TEST_F(Admit, StashWithCudaIpcEventIsInvalidArgumentNamingCounters) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_ready()->set_cuda_ipc_event(std::string(64, 'e'));
  EXPECT_REJECTED(Check(r), kInvalidArgument, "EventRef.counter");
  r = Stash(3, kTicket);
  r.mutable_stash()->mutable_done()->set_cuda_ipc_event(std::string(64, 'e'));
  EXPECT_REJECTED(Check(r), kInvalidArgument, "EventRef.counter");
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, StashWithBadHostCounterEventIsRejected) {
  v1::SessionRequest r = Stash(2, kTicket);
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(kMem);
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(12);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "8-byte aligned");
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(kMemBytes);
  EXPECT_REJECTED(Check(r), kInvalidArgument, "past the end");
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(42);
  EXPECT_REJECTED(Check(r), kNotFound, "RegisterMemory");
  r.mutable_stash()->mutable_ready()->clear_kind();
  EXPECT_REJECTED(Check(r), kInvalidArgument, "no event");
  EXPECT_FALSE(TicketLive(kTicket));
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(kMem);
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(kMemBytes - 8);
  EXPECT_TRUE(Check(r).ok());
}

TEST(AdmitCuda, CountersAreTheEventsOfTheCudaBackendToo) {
  Session session(SessionInfo{}, nullptr, nullptr);
  AdmitLimits limits;
  limits.backend = v1::BACKEND_CUDA;
  ASSERT_TRUE(
      AdmitRequest(Register(1, kMem, kMemBytes, v1::MEMORY_KIND_CUDA_IPC, std::string(64, 'h')),
                   session, limits)
          .ok());
  ASSERT_TRUE(AdmitRequest(Register(2, 9, 4096), session, limits).ok());
  v1::SessionRequest r = Stash(3, kTicket);
  r.mutable_stash()->mutable_ready()->set_cuda_ipc_event(std::string(64, 'e'));
  Status s = AdmitRequest(r, session, limits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("counter"));
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(9);
  r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(4088);
  r.mutable_stash()->mutable_done()->mutable_counter()->set_memory_id(9);
  r.mutable_stash()->mutable_done()->mutable_counter()->set_offset(8);
  EXPECT_TRUE(AdmitRequest(r, session, limits).ok());
}

// ---- Reload / Release -------------------------------------------------------------------------

TEST_F(Admit, ReloadOfUnknownTicketIsNotFound) {
  EXPECT_REJECTED(Check(Reload(2, kTicket)), kNotFound, "not a live stash");
}

TEST_F(Admit, ReloadOfAnotherSessionsTicketIsNotFound) {
  // A ticket of another session is NOT_FOUND to you, even with the same memory id registered.
  Session other(SessionInfo{}, nullptr, nullptr);
  ASSERT_TRUE(AdmitRequest(Register(1, kMem, kMemBytes), other, limits_).ok());
  ASSERT_TRUE(AdmitRequest(Stash(2, kTicket), other, limits_).ok());
  EXPECT_REJECTED(Check(Reload(2, kTicket)), kNotFound, "not a live stash");
  EXPECT_REJECTED(Check(Release(3, kTicket)), kNotFound, "not a live stash");
  // The owner still can.
  EXPECT_TRUE(AdmitRequest(Reload(3, kTicket), other, limits_).ok());
}

TEST_F(Admit, ReloadIntoTooSmallDestinationIsInvalidArgumentAndKeepsTheStash) {
  ASSERT_TRUE(Check(Register(2, 2, 1000)).ok());
  ASSERT_TRUE(Check(Stash(3, kTicket, kMem, 0, 64, 16)).ok());  // 1024 bytes
  EXPECT_REJECTED(Check(Reload(4, kTicket, 2, 0)), kInvalidArgument, "reload destination");
  EXPECT_REJECTED(Check(Reload(5, kTicket, kMem, kMemBytes - 1000)), kInvalidArgument,
                  "past the end");
  EXPECT_TRUE(TicketLive(kTicket));
  EXPECT_TRUE(Check(Reload(6, kTicket, kMem, kMemBytes - 1024)).ok());
  EXPECT_FALSE(TicketLive(kTicket));
}

TEST_F(Admit, ReloadWithoutDestinationIsInvalidArgument) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  v1::SessionRequest r = Reload(3, kTicket);
  r.mutable_reload()->clear_destination();
  EXPECT_REJECTED(Check(r), kInvalidArgument, "destination");
  EXPECT_TRUE(TicketLive(kTicket));
}

TEST_F(Admit, ReloadIntoUnknownMemoryIsNotFound) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  EXPECT_REJECTED(Check(Reload(3, kTicket, 42)), kNotFound, "RegisterMemory");
  EXPECT_TRUE(TicketLive(kTicket));
}

TEST_F(Admit, ReloadWithCudaIpcEventIsInvalidArgument) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  v1::SessionRequest r = Reload(3, kTicket);
  r.mutable_reload()->mutable_ready()->set_cuda_ipc_event(std::string(64, 'e'));
  EXPECT_REJECTED(Check(r), kInvalidArgument, "EventRef.counter");
  EXPECT_TRUE(TicketLive(kTicket));
}

TEST_F(Admit, ReleaseOfUnknownTicketIsNotFound) {
  EXPECT_REJECTED(Check(Release(2, kTicket)), kNotFound, "not a live stash");
}

TEST_F(Admit, SecondReloadOrReleaseOfATicketIsNotFound) {
  ASSERT_TRUE(Check(Stash(2, kTicket)).ok());
  ASSERT_TRUE(Check(Reload(3, kTicket)).ok());
  EXPECT_REJECTED(Check(Reload(4, kTicket)), kNotFound, "already reloaded or released");
  EXPECT_REJECTED(Check(Release(5, kTicket)), kNotFound, "reload or release of it is queued");
  session_.ForgetTicket(kTicket);
  ASSERT_TRUE(Check(Stash(5, kTicket)).ok());
  ASSERT_TRUE(Check(Release(6, kTicket)).ok());
  EXPECT_REJECTED(Check(Release(7, kTicket)), kNotFound, "not a live stash");
  EXPECT_REJECTED(Check(Reload(8, kTicket)), kNotFound, "not a live stash");
  session_.ForgetTicket(kTicket);
  EXPECT_REJECTED(Check(Reload(9, kTicket)), kNotFound, "not a live stash");
}

// ---- Whole sequences --------------------------------------------------------------------------

TEST_F(Admit, RejectedRequestsChangeNothing) {
  // A bad stash does not make its ticket live: reloading it is NOT_FOUND, reusing it is fine.
  EXPECT_FALSE(Check(Stash(2, kTicket, kMem, kMemBytes, 64, 16)).ok());
  EXPECT_FALSE(TicketLive(kTicket));
  EXPECT_EQ(Check(Reload(3, kTicket)).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Check(Stash(4, kTicket)).ok());
  // A bad registration declares nothing.
  EXPECT_FALSE(Check(Register(5, 7, 4096, v1::MEMORY_KIND_CUDA_IPC)).ok());
  EXPECT_FALSE(MemoryDeclared(7));
  EXPECT_EQ(Check(Stash(6, 99, 7)).code(), StatusCode::kNotFound);
  // A too-busy session's request is not admitted either.
  session_.counters().inflight = limits_.max_inflight;
  EXPECT_FALSE(Check(Release(7, kTicket)).ok());
  session_.counters().inflight = 0;
  EXPECT_TRUE(TicketLive(kTicket));
}

TEST_F(Admit, GoodSequenceIsAdmitted) {
  EXPECT_TRUE(Check(BeginStep(2)).ok());
  EXPECT_TRUE(Check(Register(3, 2, 4096)).ok());  // event counters
  v1::SessionRequest stash = Stash(4, kTicket, kMem, 4096, 128, 64);
  stash.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(2);
  stash.mutable_stash()->mutable_ready()->set_value(1);
  stash.mutable_stash()->mutable_done()->mutable_counter()->set_memory_id(2);
  stash.mutable_stash()->mutable_done()->mutable_counter()->set_offset(8);
  stash.mutable_stash()->mutable_done()->set_value(1);
  EXPECT_TRUE(Check(stash).ok());
  EXPECT_TRUE(TicketLive(kTicket));
  EXPECT_TRUE(Check(Stash(5, kTicket + 1, kMem, 65536, 128, 64)).ok());
  v1::SessionRequest reload = Reload(6, kTicket, kMem, 131072);
  reload.mutable_reload()->set_zero_tail(true);
  reload.mutable_reload()->mutable_done()->mutable_counter()->set_memory_id(2);
  reload.mutable_reload()->mutable_done()->mutable_counter()->set_offset(16);
  EXPECT_TRUE(Check(reload).ok());
  EXPECT_FALSE(TicketLive(kTicket));
  EXPECT_TRUE(Check(Release(7, kTicket + 1)).ok());
  EXPECT_FALSE(TicketLive(kTicket + 1));
  EXPECT_TRUE(Check(Unregister(8, 2)).ok());
  EXPECT_TRUE(Check(BeginStep(9)).ok());
}

// ---- Hello ------------------------------------------------------------------------------------

TEST(CheckHello, MatchingBackendAndDeviceInRangeIsOk) {
  EXPECT_TRUE(CheckHello(HostHello(0), v1::BACKEND_HOST, 1).ok());
  EXPECT_TRUE(CheckHello(HostHello(3), v1::BACKEND_HOST, 4).ok());
}

TEST(CheckHello, WrongBackendIsFailedPreconditionNamingTheFix) {
  v1::Hello hello = HostHello();
  hello.set_backend(v1::BACKEND_CUDA);
  Status s = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("--backend=cuda"));
  hello.set_backend(v1::BACKEND_UNSPECIFIED);
  s = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("BACKEND_HOST"));
  EXPECT_THAT(s.message(), Not(HasSubstr("--backend=unspecified")));
}

TEST(CheckHello, UnknownBackendIsInvalidArgumentNamingTheKnownOnes) {
  v1::Hello hello = HostHello();
  hello.set_backend(static_cast<v1::Backend>(99));
  const Status s = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message(),
            "Hello.backend 99 is not a known Backend: use BACKEND_HOST or BACKEND_CUDA");
}

TEST(CheckHello, LabelAndVersionOverTheLimitAreInvalidArgumentWithoutEchoingThem) {
  v1::Hello hello = HostHello();
  hello.set_label(std::string(kMaxTextBytes, 'l'));
  hello.set_client_version(std::string(kMaxTextBytes, 'v'));
  EXPECT_TRUE(CheckHello(hello, v1::BACKEND_HOST, 1).ok());
  hello.set_label(std::string(5 << 20, 'l'));
  Status s = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString().substr(0, 200);
  EXPECT_EQ(s.message(), "Hello.label is 5242880 bytes, over the limit of 256 bytes: shorten it");
  hello.set_label("");
  hello.set_client_version(std::string(300, 'v'));
  s = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Hello.client_version is 300 bytes"));
}

TEST(CheckHello, DeviceOutOfRangeIsInvalidArgumentNamingTheRange) {
  for (int32_t device : {1, 2, -1}) {
    const Status s = CheckHello(HostHello(device), v1::BACKEND_HOST, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << device << ": " << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("devices 0..0")) << device;
  }
  const Status s = CheckHello(HostHello(4), v1::BACKEND_HOST, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("devices 0..3"));
}

// A rank using device 5 of 8 on a daemon serving 4 GPUs: its UUID picks the pool, so its own
// ordinal is no index into the daemon's pools. Without a UUID the index still must be in range.
TEST(CheckHello, CudaDeviceIndexPastThePoolsIsOkWhenTheUuidNamesTheGpu) {
  v1::Hello hello = HostHello(5);
  hello.set_backend(v1::BACKEND_CUDA);
  hello.set_device_uuid(std::string(16, '\x42'));
  EXPECT_TRUE(CheckHello(hello, v1::BACKEND_CUDA, 4).ok());
  hello.set_device(-1);
  EXPECT_EQ(CheckHello(hello, v1::BACKEND_CUDA, 4).code(), StatusCode::kInvalidArgument);
  hello.set_device(5);
  hello.clear_device_uuid();
  const Status s = CheckHello(hello, v1::BACKEND_CUDA, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("devices 0..3"));
}

}  // namespace
}  // namespace stash::daemon

namespace stash::daemon {
namespace {

TEST(CheckHello, MappedModeIsForEitherBackendAndAnUnknownModeIsRefused) {
  v1::Hello hello = HostHello();
  hello.set_mode(v1::MODE_MAPPED);
  EXPECT_TRUE(CheckHello(hello, v1::BACKEND_HOST, 1).ok());
  hello.set_backend(v1::BACKEND_CUDA);
  EXPECT_TRUE(CheckHello(hello, v1::BACKEND_CUDA, 1).ok());
  hello = HostHello();
  hello.set_mode(static_cast<v1::Mode>(77));
  const Status odd = CheckHello(hello, v1::BACKEND_HOST, 1);
  EXPECT_EQ(odd.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.message(), HasSubstr("MODE_MAPPED"));
}

TEST(AdmitMapped, AMappedSessionsStreamCarriesNoDataPath) {
  SessionInfo info;
  info.mapped = true;
  Session session(info, nullptr, nullptr);
  AdmitLimits limits;
  v1::SessionRequest r;
  r.set_request_id(1);
  r.mutable_begin_step()->set_step(3);
  const Status s = AdmitRequest(r, session, limits);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("mapped mode"));
  r.mutable_stash()->set_ticket(9);
  EXPECT_EQ(AdmitRequest(r, session, limits).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace stash::daemon

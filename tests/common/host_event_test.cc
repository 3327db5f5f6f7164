// Host-backend events (common/host_event.h): counters that only grow, futex waits that wake
// across threads and across processes, and waits that time out.
#include "common/host_event.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace stash {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Long enough never to fire on a healthy machine; a wait that needs it has hung.
constexpr seconds kHang(30);

TEST(HostEvent, SignalRaisesTheCounterAndNeverLowersIt) {
  alignas(8) uint64_t counter = 0;
  EXPECT_EQ(EventValue(&counter), 0u);
  EventSignal(&counter, 5);
  EXPECT_EQ(EventValue(&counter), 5u);
  EventSignal(&counter, 3);
  EXPECT_EQ(EventValue(&counter), 5u);
  EventSignal(&counter, 5);
  EXPECT_EQ(EventValue(&counter), 5u);
  EventSignal(&counter, 1ULL << 40);  // counters are 64-bit
  EXPECT_EQ(EventValue(&counter), 1ULL << 40);
}

TEST(HostEvent, ReachedComparesAgainstTheValue) {
  alignas(8) uint64_t counter = 0;
  EXPECT_TRUE(EventReached(&counter, 0));
  EXPECT_FALSE(EventReached(&counter, 1));
  EventSignal(&counter, 2);
  EXPECT_TRUE(EventReached(&counter, 1));
  EXPECT_TRUE(EventReached(&counter, 2));
  EXPECT_FALSE(EventReached(&counter, 3));
}

TEST(HostEvent, WaitReturnsTrueAtOnceWhenAlreadyReached) {
  alignas(8) uint64_t counter = 7;
  EXPECT_TRUE(EventWait(&counter, 0, milliseconds(0)));
  EXPECT_TRUE(EventWait(&counter, 7, milliseconds(0)));
  EXPECT_TRUE(EventWait(&counter, 6, kHang));
}

TEST(HostEvent, WaitReturnsFalseWhenTheTimeoutPasses) {
  alignas(8) uint64_t counter = 3;
  EXPECT_FALSE(EventWait(&counter, 4, milliseconds(0)));
  EXPECT_FALSE(EventWait(&counter, 4, milliseconds(20)));
  EXPECT_EQ(EventValue(&counter), 3u);
}

TEST(HostEvent, WaitWakesWhenAnotherThreadSignals) {
  alignas(8) uint64_t counter = 0;
  std::atomic<bool> woke{false};
  std::thread waiter([&] { woke = EventWait(&counter, 1, kHang); });
  EventSignal(&counter, 1);
  waiter.join();
  EXPECT_TRUE(woke);
}

TEST(HostEvent, WaitersOfEarlierValuesAllWake) {
  alignas(8) uint64_t counter = 0;
  std::atomic<int> woke{0};
  std::thread a([&] { woke += EventWait(&counter, 1, kHang) ? 1 : 0; });
  std::thread b([&] { woke += EventWait(&counter, 2, kHang) ? 1 : 0; });
  EventSignal(&counter, 2);  // one signal past both values
  a.join();
  b.join();
  EXPECT_EQ(woke, 2);
}

TEST(HostEvent, PingPongBetweenThreadsNeverMissesASignal) {
  alignas(8) uint64_t ping = 0;
  alignas(8) uint64_t pong = 0;
  constexpr uint64_t kRounds = 2000;
  std::atomic<bool> ok{true};
  std::thread other([&] {
    for (uint64_t i = 1; i <= kRounds; ++i) {
      if (!EventWait(&ping, i, kHang)) {
        ok = false;
        return;
      }
      EventSignal(&pong, i);
    }
  });
  for (uint64_t i = 1; i <= kRounds; ++i) {
    EventSignal(&ping, i);
    ASSERT_TRUE(EventWait(&pong, i, kHang)) << "round " << i;
  }
  other.join();
  EXPECT_TRUE(ok);
}

// The host backend's real use: the client and the daemon are different processes sharing a
// mapping. The child only waits, signals and _exits (async-signal-safe), so forking this
// process is safe even if gtest had started threads.
TEST(HostEvent, PingPongAcrossProcessesThroughSharedMemory) {
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* ping = static_cast<uint64_t*>(mem);
  uint64_t* pong = ping + 1;
  constexpr uint64_t kRounds = 500;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (uint64_t i = 1; i <= kRounds; ++i) {
      if (!EventWait(ping, i, kHang)) _exit(1);
      EventSignal(pong, i);
    }
    _exit(0);
  }
  bool all = true;
  for (uint64_t i = 1; i <= kRounds && all; ++i) {
    EventSignal(ping, i);
    all = EventWait(pong, i, kHang);
    EXPECT_TRUE(all) << "round " << i;
  }
  int status = 0;
  if (!all) kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(EventValue(pong), kRounds);
  munmap(mem, 4096);
}

}  // namespace
}  // namespace stash

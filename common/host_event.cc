#include "common/host_event.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace stash {
namespace {

// The futex word is the low half of the little-endian counter: every increment changes it.
uint32_t* LowWord(uint64_t* counter) { return reinterpret_cast<uint32_t*>(counter); }

}  // namespace

uint64_t EventValue(const uint64_t* counter) { return __atomic_load_n(counter, __ATOMIC_ACQUIRE); }

void EventSignal(uint64_t* counter, uint64_t value) {
  uint64_t seen = __atomic_load_n(counter, __ATOMIC_RELAXED);
  while (seen < value && !__atomic_compare_exchange_n(counter, &seen, value, /*weak=*/true,
                                                      __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
  // Shared (not FUTEX_PRIVATE) so waiters in other processes wake.
  syscall(SYS_futex, LowWord(counter), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

bool EventWait(uint64_t* counter, uint64_t value, std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const uint64_t seen = EventValue(counter);
    if (seen >= value) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(left.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(left.count() % 1000000000);
    // Returns at once (EAGAIN) if the low word changed since `seen` was read.
    syscall(SYS_futex, LowWord(counter), FUTEX_WAIT, static_cast<uint32_t>(seen), &ts, nullptr, 0);
  }
}

}  // namespace stash

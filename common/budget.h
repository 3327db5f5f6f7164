// A shared budget: a counter that many threads raise only while it stays within a limit.
#ifndef STASH_COMMON_BUDGET_H_
#define STASH_COMMON_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace stash {

// Adds `amount` to `*counter` unless that would pass `limit`; returns whether it did. `*seen` is
// the counter's value as last read (for the message of a refusal).
inline bool TakeFromBudget(std::atomic<uint64_t>* counter, uint64_t amount, uint64_t limit,
                           uint64_t* seen) {
  uint64_t now = counter->load(std::memory_order_relaxed);
  do {
    *seen = now;
    if (now > limit || amount > limit - now) return false;
  } while (!counter->compare_exchange_weak(now, now + amount, std::memory_order_relaxed));
  return true;
}

}  // namespace stash

#endif  // STASH_COMMON_BUDGET_H_

// Host-backend events: 64-bit counters in shared memory (docs/design.md). Recording an event
// raises its counter to a value and wakes futex waiters; waiting blocks until the counter reaches
// a value. Counters only grow, so a waiter can never miss a signal.
#ifndef STASH_COMMON_HOST_EVENT_H_
#define STASH_COMMON_HOST_EVENT_H_

#include <chrono>
#include <cstdint>

namespace stash {

// The counter's current value (acquire).
uint64_t EventValue(const uint64_t* counter);

// Raises the counter to `value` if it is lower (release) and wakes every waiter, in any process.
void EventSignal(uint64_t* counter, uint64_t value);

// Whether the counter has reached `value`.
inline bool EventReached(const uint64_t* counter, uint64_t value) {
  return EventValue(counter) >= value;
}

// Blocks until the counter reaches `value` or `timeout` passes; true when reached. The counter
// must be 8-byte aligned in memory shared with the signaller.
bool EventWait(uint64_t* counter, uint64_t value, std::chrono::nanoseconds timeout);

}  // namespace stash

#endif  // STASH_COMMON_HOST_EVENT_H_

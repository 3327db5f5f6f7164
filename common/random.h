// Unguessable identifiers (session ids, secrets, shm names) from the kernel's CSPRNG, and
// IdSequence for ids that must only be distinct (a session's request ids and tickets).
#ifndef STASH_COMMON_RANDOM_H_
#define STASH_COMMON_RANDOM_H_

#include <cstdint>
#include <string>

namespace stash {

// A uniformly random 64-bit value from getrandom(2); never 0.
uint64_t RandomNonZeroU64();

// `bytes` random bytes (secrets).
std::string RandomBytes(size_t bytes);

// `bytes` random bytes as 2*bytes lowercase hex characters.
std::string RandomHex(size_t bytes);

// Distinct, random-looking, non-zero 64-bit ids without a syscall each: a bijective mix
// (splitmix64's finalizer) of a counter that starts at a random value, so no id repeats within
// 2^64 draws. Predictable from one id it drew: not for secrets. Not thread-safe.
class IdSequence {
 public:
  IdSequence() : next_(RandomNonZeroU64()) {}
  uint64_t Next() {
    uint64_t id = 0;
    while (id == 0) id = Mix(next_++);
    return id;
  }

 private:
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t next_;
};

}  // namespace stash

#endif  // STASH_COMMON_RANDOM_H_

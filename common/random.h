// Unguessable identifiers (session ids, tickets, shm names) from the kernel's CSPRNG.
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

}  // namespace stash

#endif  // STASH_COMMON_RANDOM_H_

// Chunks as the daemon hands them out, made by the tests themselves, and the lease geometry the
// client unit tests share.
#ifndef STASH_TESTS_CLIENT_CHUNK_FAKES_H_
#define STASH_TESTS_CLIENT_CHUNK_FAKES_H_

#include <array>
#include <cstdint>
#include <utility>

#include "common/shm.h"
#include "common/unique_fd.h"
#include "stash/kernels/lease_control.h"

namespace stash::testing {

inline constexpr uint64_t kPage = 4096;
inline constexpr uint64_t kChunk = 4 * kPage;

// The same capacity for every tier.
inline std::array<uint64_t, kernels::kLeaseTiers> Caps(uint64_t bytes) {
  return {bytes, bytes, bytes};
}

// A memfd of `bytes` bytes sealed against shrinking and growing, like a daemon's chunk (invalid
// on failure).
inline UniqueFd FakeChunk(uint64_t bytes) {
  auto fd = CreateSealedMemfd("test-chunk", bytes);
  return fd.ok() ? std::move(fd).value() : UniqueFd();
}

}  // namespace stash::testing

#endif  // STASH_TESTS_CLIENT_CHUNK_FAKES_H_

// Chunks as the daemon hands them out, made by the tests themselves: sealed memfds.
#ifndef STASH_TESTS_CLIENT_CHUNK_FAKES_H_
#define STASH_TESTS_CLIENT_CHUNK_FAKES_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "common/unique_fd.h"

namespace stash::testing {

// A memfd of `bytes` bytes sealed against shrinking and growing, like a daemon's chunk.
inline UniqueFd FakeChunk(uint64_t bytes) {
  UniqueFd fd(memfd_create("test-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return UniqueFd();
  fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_CLIENT_CHUNK_FAKES_H_

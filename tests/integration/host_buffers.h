// Host buffers and stash arguments the integration tests share.
#ifndef STASH_TESTS_INTEGRATION_HOST_BUFFERS_H_
#define STASH_TESTS_INTEGRATION_HOST_BUFFERS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>

#include "stash/client.h"

namespace stash::testing {

// A HostBuffer of `bytes`, filled with bytes drawn from `seed` (0: left zero).
inline std::unique_ptr<HostBuffer> Buffer(uint64_t bytes, uint32_t seed = 0) {
  auto b = HostBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (seed != 0) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < (*b)->size(); ++i) (*b)->data()[i] = static_cast<uint8_t>(rng());
  }
  return std::move(b).value();
}

// A stash of `rows` rows of `row_bytes` from the start of `src`, every row valid.
inline StashArgs Args(const HostBuffer& src, uint64_t row_bytes, uint64_t rows) {
  StashArgs a;
  a.source = &src;
  a.row_bytes = row_bytes;
  a.max_rows = rows;
  a.count.value = rows;
  return a;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_INTEGRATION_HOST_BUFFERS_H_

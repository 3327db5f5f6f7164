// What one session_request_fuzzer input is: the session it starts from and how its bytes split
// into requests. The fuzzer and the seed generator (session_request_seeds.cc) share it, so the
// committed seeds name the memories and tickets the fuzzer registers.
//
// Layout: one setup byte, then at most kMaxRequests records, each a varint length and that many
// bytes of a serialized stash.v1.SessionRequest (protobuf's delimited format). A length that runs
// past the end takes the bytes that are left.
#ifndef STASH_TESTS_FUZZ_SESSION_INPUT_H_
#define STASH_TESTS_FUZZ_SESSION_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stash/v1/stash.pb.h"

namespace stash::fuzz {

// Setup byte: which daemon the session talks to.
constexpr uint8_t kSetupCuda = 1 << 0;   // cuda backend (else host)
constexpr uint8_t kSetupTight = 1 << 1;  // kTightInflight / kTightMemories instead of defaults
// Bits 2..4: pools - 1 for CheckHello (1..8 pools).
constexpr int PoolsOf(uint8_t setup) { return 1 + ((setup >> 2) & 7); }
constexpr uint8_t kSetupTightTotal = 1 << 5;  // kTightMemoriesTotal over all sessions

constexpr uint32_t kTightInflight = 8;
constexpr uint64_t kTightMemories = 6;
constexpr uint64_t kTightMemoriesTotal = 5;
constexpr size_t kMaxRequests = 16;

// Memories every input starts with (MEMORY_KIND_HOST_FD; kCudaMemory, MEMORY_KIND_CUDA_IPC, only
// on cuda).
constexpr uint64_t kSmallMemory = 1;  // 4 KiB
constexpr uint64_t kSmallMemoryBytes = 4096;
constexpr uint64_t kBigMemory = 2;  // 1 MiB
constexpr uint64_t kBigMemoryBytes = 1 << 20;
constexpr uint64_t kHugeMemory = 3;  // 2^62 bytes: ranges near 64-bit overflow
constexpr uint64_t kHugeMemoryBytes = uint64_t{1} << 62;
constexpr uint64_t kCudaMemory = 4;  // MEMORY_KIND_CUDA_IPC, 1 GiB
constexpr uint64_t kCudaMemoryBytes = uint64_t{1} << 30;

// Live tickets every input starts with: 16 rows of 64 bytes from kBigMemory, and all of
// kSmallMemory as 512 rows of 8 bytes.
constexpr uint64_t kTicketBig = 0x1111;
constexpr uint64_t kTicketSmall = 0x2222;

struct SessionInput {
  uint8_t setup = 0;
  std::vector<std::string_view> records;  // point into the input
};

inline SessionInput SplitInput(const uint8_t* data, size_t size) {
  SessionInput in;
  if (size == 0) return in;
  in.setup = data[0];
  const char* p = reinterpret_cast<const char*>(data) + 1;
  const char* end = reinterpret_cast<const char*>(data) + size;
  while (p < end && in.records.size() < kMaxRequests) {
    uint64_t len = 0;
    int shift = 0;
    while (p < end && shift < 35) {  // at most 5 bytes, like a varint32
      const auto b = static_cast<uint8_t>(*p++);
      len |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    const auto left = static_cast<size_t>(end - p);
    const size_t take = len < left ? static_cast<size_t>(len) : left;
    in.records.emplace_back(p, take);
    p += take;
  }
  return in;
}

inline std::string JoinInput(uint8_t setup,
                             const std::vector<stash::v1::SessionRequest>& requests) {
  std::string out(1, static_cast<char>(setup));
  for (const auto& r : requests) {
    const std::string bytes = r.SerializeAsString();
    uint64_t len = bytes.size();
    do {
      out.push_back(static_cast<char>((len & 0x7f) | (len > 0x7f ? 0x80 : 0)));
      len >>= 7;
    } while (len != 0);
    out += bytes;
  }
  return out;
}

}  // namespace stash::fuzz

#endif  // STASH_TESTS_FUZZ_SESSION_INPUT_H_

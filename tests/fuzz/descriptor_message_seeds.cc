// Writes the seed corpus of descriptor_message_fuzzer: descriptor-channel packets, one file each,
// named seed-<what>. Byte 0 of each input says how many descriptors arrived with the packet
// (low 3 bits) and which prepared descriptor they are (bits 3..5: 0 sealed memfd, 1 unsealed,
// 2 write-sealed, 3 small sealed, 4 pipe); the packet follows.
//
//   descriptor_message_seeds DIR   (./scripts/fuzz --seeds writes
//   tests/fuzz/corpus/descriptor_message)
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "stash/v1/descriptor.pb.h"

namespace {

namespace v1 = stash::v1;

std::string Deposit(uint64_t id, uint64_t bytes) {
  v1::DescriptorRequest r;
  r.set_session_id("0123456789abcdef0123456789abcdef");
  r.set_session_secret(std::string(32, '\x42'));
  r.mutable_deposit_memory()->set_memory_id(id);
  r.mutable_deposit_memory()->set_bytes(bytes);
  return r.SerializeAsString();
}

std::string Input(unsigned descriptors, unsigned which, const std::string& packet) {
  return std::string(1, static_cast<char>((which << 3) | descriptors)) + packet;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR   (writes the seed corpus of descriptor_message_fuzzer)\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const struct {
    const char* name;
    std::string input;
  } seeds[] = {
      {"deposit-sealed", Input(1, 0, Deposit(7, 65536))},
      {"deposit-sealed-small", Input(1, 3, Deposit(8, 4096))},
      {"deposit-too-large", Input(1, 3, Deposit(9, 65536))},
      {"deposit-unsealed", Input(1, 1, Deposit(10, 4096))},
      {"deposit-write-sealed", Input(1, 2, Deposit(11, 4096))},
      {"deposit-pipe", Input(1, 4, Deposit(12, 4096))},
      {"deposit-no-descriptor", Input(0, 0, Deposit(13, 4096))},
      {"deposit-two-descriptors", Input(2, 0, Deposit(14, 4096))},
      {"empty-packet", Input(0, 0, "")},
  };
  for (const auto& seed : seeds) {
    std::ofstream out(dir + "/seed-" + seed.name, std::ios::binary);
    out << seed.input;
    if (!out) {
      std::fprintf(stderr, "cannot write %s/seed-%s\n", dir.c_str(), seed.name);
      return 1;
    }
  }
  return 0;
}

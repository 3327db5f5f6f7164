// Writes the seed corpus of descriptor_message_fuzzer: one descriptor-channel packet per file,
// valid and refused ones, named seed-<what>. Layout (descriptor_message_fuzzer.cc): the number of
// descriptors, a status code, then the packet.
//
//   descriptor_message_seeds DIR     (./scripts/fuzz --seeds writes
//   tests/fuzz/corpus/descriptor_message)
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "stash/v1/descriptor.pb.h"

namespace {

namespace v1 = stash::v1;

v1::DescriptorRequest Deposit(uint64_t memory_id, uint64_t bytes) {
  v1::DescriptorRequest r;
  r.set_session_id("0123456789abcdef0123456789abcdef");
  r.set_session_secret(std::string(32, '\x5a'));
  r.mutable_deposit_memory()->set_memory_id(memory_id);
  r.mutable_deposit_memory()->set_bytes(bytes);
  return r;
}

std::string Input(uint8_t descriptors, uint8_t code, const v1::DescriptorRequest& r) {
  return std::string{static_cast<char>(descriptors), static_cast<char>(code)} +
         r.SerializeAsString();
}

std::vector<std::pair<std::string, std::string>> Seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  seeds.emplace_back("seed-deposit", Input(1, 0, Deposit(7, 1 << 20)));
  seeds.emplace_back("seed-deposit-answered-permission-denied", Input(1, 7, Deposit(7, 4096)));
  seeds.emplace_back("seed-deposit-without-descriptor", Input(0, 3, Deposit(7, 4096)));
  seeds.emplace_back("seed-deposit-with-two-descriptors", Input(2, 3, Deposit(7, 4096)));
  seeds.emplace_back("seed-deposit-memory-id-zero", Input(1, 3, Deposit(0, 4096)));
  seeds.emplace_back("seed-deposit-zero-bytes", Input(1, 3, Deposit(7, 0)));
  v1::DescriptorRequest upper = Deposit(7, 4096);
  upper.set_session_id("0123456789ABCDEF0123456789ABCDEF");
  seeds.emplace_back("seed-upper-case-session-id", Input(1, 3, upper));
  v1::DescriptorRequest short_secret = Deposit(7, 4096);
  short_secret.set_session_secret(std::string(31, '\x5a'));
  seeds.emplace_back("seed-short-secret", Input(1, 3, short_secret));
  v1::DescriptorRequest no_kind = Deposit(7, 4096);
  no_kind.clear_deposit_memory();
  seeds.emplace_back("seed-no-kind", Input(0, 9, no_kind));
  seeds.emplace_back("seed-garbage",
                     std::string{'\x01', '\x0e'} + "\xff\xff\xff\xffsecret-looking-bytes");
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR   (writes the seed corpus of descriptor_message_fuzzer)\n",
                 argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : Seeds()) {
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "descriptor_message_seeds: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

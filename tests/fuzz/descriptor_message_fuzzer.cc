// libFuzzer target: arbitrary bytes as one descriptor-channel packet through
// ParseDescriptorRequest, and arbitrary statuses through DescriptorAnswer
// (daemon/descriptor_message.h), the pure functions the descriptor server runs on every packet.
//
// Input: byte 0 is how many descriptors came with the packet (0..7; the socket passes at most 4),
// byte 1 picks a status code (0..16) for the answer check, the rest is the packet.
//
// It aborts unless:
//   - a packet that parses holds a 32-character lower-case hex session id, a 32-byte secret and
//     a deposit_memory with nonzero memory_id and bytes, came with exactly one descriptor, and
//     parses the same again after re-serialization;
//   - a refused packet gets INVALID_ARGUMENT with a message that is not empty, is valid UTF-8,
//     is at most 4 KiB and does not repeat the packet, its session id or its secret (when they
//     hold bytes outside printable ASCII, which no message template has);
//   - every answer (to the packet, and for the fuzzed code with the packet's bytes as its
//     message) parses as a DescriptorResponse with the same code and memory_id, a valid UTF-8
//     message of at most 1024 bytes (the same message when it already was one), and is not an
//     empty packet (which reads as the connection closing) unless it answers nothing.
//
// STASH_FUZZ_TRACE=1 prints each parse result.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/descriptor_message.h"
#include "stash/v1/descriptor.pb.h"
#include "tests/fuzz/utf8.h"

namespace stash::fuzz {
namespace {

namespace v1 = stash::v1;

constexpr size_t kMaxMessageBytes = 4096;
constexpr size_t kMaxAnswerMessageBytes = 1024;

[[noreturn]] void Violated(const char* invariant, const std::string& packet, const Status& status) {
  v1::DescriptorRequest lenient;
  const bool parses = lenient.ParseFromString(packet);
  std::fprintf(stderr,
               "descriptor_message_fuzzer: invariant violated: %s\n  packet (%zu bytes%s): %s\n"
               "  status: %s\n",
               invariant, packet.size(), parses ? ", parses" : ", does not parse",
               parses ? lenient.ShortDebugString().c_str() : "", status.ToString().c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, packet, status)              \
  do {                                                \
    if (!(cond)) Violated(#cond, (packet), (status)); \
  } while (0)

bool IsLowerHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Whether `message` repeats `secretish`. Only bytes outside printable ASCII tell: the fuzzer
// soon makes a session id out of the words of the message that refuses it.
bool Repeats(const std::string& message, const std::string& secretish) {
  bool binary = false;
  for (char c : secretish) binary = binary || c < ' ' || c > '~';
  return binary && secretish.size() >= 8 && message.find(secretish) != std::string::npos;
}

// DescriptorAnswer(status, memory_id) is a packet the client can read back.
void CheckAnswer(const std::string& packet, const Status& status, uint64_t memory_id) {
  const std::string answer = daemon::DescriptorAnswer(status, memory_id);
  FUZZ_CHECK(!answer.empty() || (status.ok() && memory_id == 0), packet, status);
  v1::DescriptorResponse response;
  FUZZ_CHECK(response.ParseFromString(answer), packet, status);
  FUZZ_CHECK(response.code() == static_cast<int>(status.code()), packet, status);
  FUZZ_CHECK(response.memory_id() == memory_id, packet, status);
  FUZZ_CHECK(response.message().size() <= kMaxAnswerMessageBytes, packet, status);
  FUZZ_CHECK(IsUtf8(response.message()), packet, status);
  if (IsUtf8(status.message()) && status.message().size() <= kMaxAnswerMessageBytes) {
    FUZZ_CHECK(response.message() == status.message(), packet, status);
  }
}

void Run(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t descriptors = data[0] & 7;
  const auto code = static_cast<StatusCode>(data[1] % 17);
  const std::string packet(reinterpret_cast<const char*>(data) + 2, size - 2);

  const StatusOr<v1::DescriptorRequest> parsed =
      daemon::ParseDescriptorRequest(packet, descriptors);
  if (std::getenv("STASH_FUZZ_TRACE") != nullptr) {
    std::fprintf(
        stderr, "%zu bytes, %zu descriptors -> %s\n", packet.size(), descriptors,
        parsed.ok() ? parsed->ShortDebugString().c_str() : parsed.status().ToString().c_str());
  }
  const Status& status = parsed.status();
  if (parsed.ok()) {
    const v1::DescriptorRequest& r = *parsed;
    FUZZ_CHECK(r.session_id().size() == 32 && IsLowerHex(r.session_id()), packet, status);
    FUZZ_CHECK(r.session_secret().size() == 32, packet, status);
    FUZZ_CHECK(r.has_deposit_memory() && r.deposit_memory().memory_id() != 0 &&
                   r.deposit_memory().bytes() != 0,
               packet, status);
    FUZZ_CHECK(descriptors == 1, packet, status);
    const auto again = daemon::ParseDescriptorRequest(r.SerializeAsString(), descriptors);
    FUZZ_CHECK(again.ok() && again->SerializeAsString() == r.SerializeAsString(), packet, status);
    CheckAnswer(packet, Status::Ok(), r.deposit_memory().memory_id());
  } else {
    FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument, packet, status);
    FUZZ_CHECK(!status.message().empty(), packet, status);
    FUZZ_CHECK(status.message().size() <= kMaxMessageBytes, packet, status);
    FUZZ_CHECK(IsUtf8(status.message()), packet, status);
    FUZZ_CHECK(!Repeats(status.message(), packet), packet, status);
    v1::DescriptorRequest lenient;
    if (lenient.ParseFromString(packet)) {
      FUZZ_CHECK(!Repeats(status.message(), lenient.session_id()), packet, status);
      FUZZ_CHECK(!Repeats(status.message(), lenient.session_secret()), packet, status);
    }
    CheckAnswer(packet, status, 0);
  }
  // Any status the server may answer with, with the packet's bytes as its message.
  const Status any = code == StatusCode::kOk ? Status::Ok() : Status(code, packet);
  CheckAnswer(packet, any, size);
}

}  // namespace
}  // namespace stash::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Parsing arbitrary bytes makes protobuf log (invalid UTF-8 in string fields).
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stash::fuzz::Run(data, size);
  return 0;
}

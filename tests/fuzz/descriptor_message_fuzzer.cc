// libFuzzer target: arbitrary packets of the descriptor channel (proto/stash/v1/descriptor.proto)
// through what the daemon runs on each: ParseDescriptorRequest, then for a parsed deposit the
// descriptor check (CheckClientMemoryFd) on one of a few prepared descriptors, and the session's
// deposit bookkeeping (Session::Deposit / TakeDeposit / CheckPeer).
//
// Input layout: byte 0 picks how many descriptors "arrived" with the packet (low 3 bits, 0..7)
// and which prepared descriptor they are (bits 3..5); the rest is the packet.
//
// It aborts when what must always hold does not:
//   - a packet that parses has a 32-hex-character session id, a 32-byte secret, a deposit with
//     nonzero id and size, and exactly one descriptor;
//   - the answer to any status (also one whose message is the packet's bytes) is a non-empty
//     packet that parses as a DescriptorResponse with the same code and memory_id, a well-formed
//     UTF-8 message (tests/fuzz/utf8.h) of at most 1024 bytes, unchanged when it already was
//     one, that never contains the packet's secret;
//   - only a sealed memfd at least as large as declared passes the check;
//   - a deposit is taken back exactly once, and never for a size larger than deposited.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/shm.h"
#include "daemon/protocol/descriptor_message.h"
#include "daemon/sessions/session.h"
#include "stash/v1/descriptor.pb.h"
#include "tests/fuzz/utf8.h"

namespace stash::fuzz {
namespace {

namespace v1 = stash::v1;

[[noreturn]] void Violated(const char* invariant) {
  std::fprintf(stderr, "descriptor_message_fuzzer: invariant violated: %s\n", invariant);
  std::abort();
}

#define FUZZ_CHECK(cond)          \
  do {                            \
    if (!(cond)) Violated(#cond); \
  } while (0)

constexpr uint64_t kSealedBytes = 1 << 16;

// Descriptors the packet may "carry": a sealed memfd, an unsealed one, a write-sealed one, a
// small sealed one, a pipe. Made once: the fuzzer runs millions of inputs.
struct Prepared {
  int fds[5];
  Prepared() {
    auto memfd = [](unsigned flags, uint64_t bytes, int seals) {
      const int fd = memfd_create("fuzz", MFD_CLOEXEC | flags);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
      if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0) std::abort();
      return fd;
    };
    const int seals = static_cast<int>(kClientMemorySeals);
    fds[0] = memfd(MFD_ALLOW_SEALING, kSealedBytes, seals);
    fds[1] = memfd(MFD_ALLOW_SEALING, kSealedBytes, 0);
    fds[2] = memfd(MFD_ALLOW_SEALING, kSealedBytes, F_SEAL_WRITE | seals);
    fds[3] = memfd(MFD_ALLOW_SEALING, 4096, seals);
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) std::abort();
    fds[4] = pipe_fds[0];
  }
};

// Whether `message` holds `secret`. Only secrets with a byte outside printable ASCII tell (real
// ones are random bytes): the fuzzer soon builds a "secret" out of the words of a message.
bool Repeats(const std::string& message, const std::string& secret) {
  bool binary = false;
  for (char c : secret) binary = binary || c < ' ' || c > '~';
  return binary && secret.size() >= 8 && message.find(secret) != std::string::npos;
}

void CheckAnswer(const Status& status, uint64_t memory_id, const std::string& secret) {
  const std::string answer = daemon::DescriptorAnswer(status, memory_id);
  FUZZ_CHECK(!answer.empty() || (status.ok() && memory_id == 0));
  v1::DescriptorResponse response;
  FUZZ_CHECK(response.ParseFromString(answer));
  FUZZ_CHECK(response.code() == static_cast<int>(status.code()));
  FUZZ_CHECK(response.memory_id() == memory_id);
  FUZZ_CHECK(response.message().size() <= 1024);
  FUZZ_CHECK(IsUtf8(response.message()));
  // A message that already was short, well-formed UTF-8 goes out as it was.
  FUZZ_CHECK(!(IsUtf8(status.message()) && status.message().size() <= 1024) ||
             response.message() == status.message());
  FUZZ_CHECK(!Repeats(response.message(), secret));
}

}  // namespace
}  // namespace stash::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stash;        // NOLINT(google-build-using-namespace)
  using namespace stash::fuzz;  // NOLINT(google-build-using-namespace)
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // parse failures of garbage are expected
    return true;
  }();
  (void)quiet;
  static const Prepared prepared;
  if (size == 0) return 0;
  const size_t descriptors = data[0] & 7;
  const int fd = prepared.fds[((data[0] >> 3) & 7) % 5];
  const std::string packet(reinterpret_cast<const char*>(data + 1), size - 1);

  // Whatever text a status carries, its answer is a packet the client can parse.
  CheckAnswer(InternalError(packet), size, "");

  auto parsed = daemon::ParseDescriptorRequest(packet, descriptors);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CheckAnswer(parsed.status(), 0, "");
    return 0;
  }
  const v1::DescriptorRequest& request = *parsed;
  FUZZ_CHECK(request.session_id().size() == 32);
  FUZZ_CHECK(request.session_secret().size() == 32);
  if (request.has_lease_chunks()) {
    // Mapped mode's requests carry no descriptor and name each lease tier at most once.
    FUZZ_CHECK(descriptors == 0);
    const v1::LeaseChunks& l = request.lease_chunks();
    FUZZ_CHECK(!(l.automatic() && l.want_size() != 0));
    bool seen[5] = {false, false, false, false, false};
    for (const v1::TierPages& w : l.want()) {
      const int t = static_cast<int>(w.tier());
      FUZZ_CHECK(t == v1::TIER_DEVICE || t == v1::TIER_PEER || t == v1::TIER_HOST);
      FUZZ_CHECK(!seen[t]);
      seen[t] = true;
    }
    return 0;
  }
  if (request.has_return_chunks()) {
    FUZZ_CHECK(descriptors == 0);
    const auto& ids = request.return_chunks().chunk_ids();
    FUZZ_CHECK(ids.size() > 0 && static_cast<size_t>(ids.size()) <= daemon::kMaxReturnChunkIds);
    std::vector<uint64_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    FUZZ_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    return 0;
  }
  FUZZ_CHECK(request.has_deposit_memory());
  FUZZ_CHECK(descriptors == 1);
  const v1::DepositMemory& d = request.deposit_memory();
  FUZZ_CHECK(d.memory_id() != 0 && d.bytes() != 0);

  // The descriptor check: only a sealed memfd at least as large as declared passes.
  const Status checked = CheckClientMemoryFd(fd, d.bytes());
  const bool good = fd == prepared.fds[0]   ? d.bytes() <= kSealedBytes
                    : fd == prepared.fds[3] ? d.bytes() <= 4096
                                            : false;
  FUZZ_CHECK(checked.ok() == good);
  CheckAnswer(checked, d.memory_id(), request.session_secret());
  if (!checked.ok()) return 0;

  // The session's bookkeeping: a bound peer, one deposit, taken back once.
  daemon::SessionInfo info;
  info.pid = 1;
  daemon::FairShare held({"deposits", 8, 1, 0, "register first"});
  daemon::Session session(info, nullptr, nullptr, {nullptr, nullptr, &held});
  FUZZ_CHECK(!session.CheckPeer({2, 0, 0}).ok());
  FUZZ_CHECK(session.CheckPeer({1, 0, 0}).ok());
  FUZZ_CHECK(!session.CheckPeer({1, 5, 0}).ok());
  UniqueFd first(dup(fd)), second(dup(fd));
  FUZZ_CHECK(session.Deposit(d.memory_id(), d.bytes(), first, 1).ok());
  FUZZ_CHECK(!first.valid());
  FUZZ_CHECK(!session.Deposit(d.memory_id() + 1, d.bytes(), second, 1).ok());
  FUZZ_CHECK(second.valid());  // a refused descriptor stays with the caller
  FUZZ_CHECK(held.used() == 1);
  const uint64_t asked = (packet.size() & 1) != 0 ? d.bytes() : d.bytes() / 2 + 1;
  auto taken = session.TakeDeposit(d.memory_id(), asked);
  FUZZ_CHECK(taken.ok() == (asked <= d.bytes()));
  FUZZ_CHECK(!session.TakeDeposit(d.memory_id(), 1).ok());
  FUZZ_CHECK(held.used() == 0);
  session.ClearDeposits();
  FUZZ_CHECK(!session.Deposit(d.memory_id(), d.bytes(), second, 1).ok());
  return 0;
}

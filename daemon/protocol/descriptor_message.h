// Parsing and checking of descriptor-channel packets (stash/v1/descriptor.proto), apart from the
// socket so that the fuzzer and the unit tests drive exactly what the server runs.
#ifndef STASH_DAEMON_DESCRIPTOR_MESSAGE_H_
#define STASH_DAEMON_DESCRIPTOR_MESSAGE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "common/unique_fd.h"

#include "stash/status.h"
#include "stash/v1/descriptor.pb.h"

namespace stash::daemon {

// The most chunk ids one ReturnChunks may name (a packet holds fewer anyway).
inline constexpr size_t kMaxReturnChunkIds = 512;

// Parses one packet of `bytes` that arrived with `descriptors` descriptors and checks its shape:
// a DescriptorRequest with a 32-character session id, a 32-byte secret, a known kind with its
// fields in range, and exactly the descriptors that kind carries (one for deposit_memory, none
// for lease_chunks and return_chunks; a lease names each of TIER_DEVICE, TIER_PEER, TIER_HOST
// at most once, or is automatic; a return names 1..kMaxReturnChunkIds distinct chunk ids).
// INVALID_ARGUMENT that says what is wrong; the message never echoes the packet.
StatusOr<stash::v1::DescriptorRequest> ParseDescriptorRequest(const std::string& bytes,
                                                              size_t descriptors);

// The packet that answers a request for `memory_id` (0 = unknown) with `status` (its message cut
// to 1024 bytes and made valid UTF-8).
std::string DescriptorAnswer(const Status& status, uint64_t memory_id = 0);
// The same for an answer with more fields set (`response`'s code and message are replaced).
std::string DescriptorAnswer(const Status& status, stash::v1::DescriptorResponse response);

// One packet sent before the last answer of a LeaseChunks (`more` set), with its descriptor.
struct DescriptorPart {
  std::string bytes;
  UniqueFd fd;
};

// What a descriptor-channel request is answered with: `parts` first, each with its one
// descriptor (owned here: the server closes them after sending), then `last` with `status`.
struct DescriptorReply {
  Status status;
  std::vector<DescriptorPart> parts;
  stash::v1::DescriptorResponse last;

  DescriptorReply() = default;
  DescriptorReply(Status s) : status(std::move(s)) {}  // NOLINT(google-explicit-constructor)
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_DESCRIPTOR_MESSAGE_H_

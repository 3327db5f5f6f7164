// Parsing and checking of descriptor-channel packets (stash/v1/descriptor.proto), apart from the
// socket so that the fuzzer and the unit tests drive exactly what the server runs.
#ifndef STASH_DAEMON_DESCRIPTOR_MESSAGE_H_
#define STASH_DAEMON_DESCRIPTOR_MESSAGE_H_

#include <cstddef>
#include <string>

#include "stash/status.h"
#include "stash/v1/descriptor.pb.h"

namespace stash::daemon {

// Parses one packet of `bytes` that arrived with `descriptors` descriptors and checks its shape:
// a DescriptorRequest with a 32-character session id, a 32-byte secret, a known kind with its
// fields in range, and exactly the descriptors that kind carries (one for deposit_memory).
// INVALID_ARGUMENT that says what is wrong; the message never echoes the packet.
StatusOr<stash::v1::DescriptorRequest> ParseDescriptorRequest(const std::string& bytes,
                                                              size_t descriptors);

// The packet that answers a request for `memory_id` (0 = unknown) with `status` (its message cut
// to 1024 bytes and made valid UTF-8).
std::string DescriptorAnswer(const Status& status, uint64_t memory_id = 0);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_DESCRIPTOR_MESSAGE_H_

// The client's end of the descriptor channel (stash/v1/descriptor.proto): hands the session's
// memfds to the daemon over `<socket>.fd` before the RegisterMemory that names them.
#ifndef STASH_CLIENT_DESCRIPTOR_CHANNEL_H_
#define STASH_CLIENT_DESCRIPTOR_CHANNEL_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash {

// Thread-safe: one request at a time goes out and is answered.
class DescriptorChannel {
 public:
  // `socket` is the gRPC socket the session connected to; `session_id` and `secret` come from
  // its Welcome.
  DescriptorChannel(std::string socket, std::string session_id, std::string secret);

  // Hands memfd `fd` (borrowed) as `memory_id` of `bytes` bytes and waits for the daemon's
  // answer (up to 10 s). Connects on first use. The daemon's refusal comes back as its status;
  // UNAVAILABLE when the daemon cannot be reached.
  Status DepositMemory(uint64_t memory_id, uint64_t bytes, int fd);

 private:
  Status ConnectLocked();

  const std::string path_;
  const std::string session_id_;
  const std::string secret_;
  std::mutex mu_;
  UniqueFd socket_;  // guarded by mu_
};

}  // namespace stash

#endif  // STASH_CLIENT_DESCRIPTOR_CHANNEL_H_

// Packets with file descriptors over a Unix SOCK_SEQPACKET socket (SCM_RIGHTS): the transport of
// the descriptor channel, which gRPC cannot carry (docs/security.md). One packet is one message;
// the descriptors sent with it arrive with it.
#ifndef STASH_COMMON_DESCRIPTOR_SOCKET_H_
#define STASH_COMMON_DESCRIPTOR_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash {

// The most descriptors one packet may carry; a packet with more is refused whole.
constexpr size_t kMaxPacketDescriptors = 4;
// The largest packet either side sends or accepts, in bytes.
constexpr size_t kMaxPacketBytes = 4096;

// Sends one packet of `bytes` (<= kMaxPacketBytes) with `fds` (<= kMaxPacketDescriptors,
// borrowed: the caller keeps and closes them). Never raises SIGPIPE. `nonblocking`: fail with
// UNAVAILABLE instead of waiting when the peer's buffer is full.
Status SendPacket(int socket, const std::string& bytes, const std::vector<int>& fds,
                  bool nonblocking = false);

// One received packet.
struct Packet {
  std::string bytes;
  std::vector<UniqueFd> fds;  // received close-on-exec
};

// Receives one packet. OUT_OF_RANGE when the peer closed the connection; INVALID_ARGUMENT when
// the packet was longer than kMaxPacketBytes or carried more than kMaxPacketDescriptors
// descriptors or ancillary data of another kind (every descriptor that did arrive is closed);
// UNAVAILABLE (`nonblocking`) when no packet is waiting.
StatusOr<Packet> ReceivePacket(int socket, bool nonblocking = false);

// Waits up to `timeout_ms` for `socket` to become readable; DEADLINE_EXCEEDED otherwise.
Status WaitReadable(int socket, int timeout_ms);

}  // namespace stash

#endif  // STASH_COMMON_DESCRIPTOR_SOCKET_H_

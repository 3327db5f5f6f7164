#include "common/descriptor_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/sys.h"

namespace stash {

Status SendPacket(int socket, const std::string& bytes, const std::vector<int>& fds,
                  bool nonblocking) {
  if (bytes.size() > kMaxPacketBytes || fds.size() > kMaxPacketDescriptors) {
    return InvalidArgumentError("a descriptor-channel packet holds at most " +
                                std::to_string(kMaxPacketBytes) + " bytes and " +
                                std::to_string(kMaxPacketDescriptors) + " descriptors");
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPacketDescriptors)];
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent = 0;
  STASH_SYSCALL_RETRY(sent, sendmsg(socket, &msg, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0)));
  if (sent < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return UnavailableError("the peer does not read its descriptor-channel answers");
    }
    return ErrnoStatus("sendmsg on the descriptor channel");
  }
  if (static_cast<size_t>(sent) != bytes.size()) {
    return InternalError("sendmsg on the descriptor channel sent a partial packet");
  }
  return Status::Ok();
}

StatusOr<Packet> ReceivePacket(int socket, bool nonblocking) {
  Packet packet;
  packet.bytes.resize(kMaxPacketBytes + 1);  // one more: a longer packet shows as MSG_TRUNC
  iovec iov{packet.bytes.data(), packet.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPacketDescriptors)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got = 0;
  STASH_SYSCALL_RETRY(got,
                      recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0)));
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return UnavailableError("no packet waiting");
    if (errno == ECONNRESET)
      return Status(StatusCode::kOutOfRange, "the peer closed the descriptor channel");
    return ErrnoStatus("recvmsg on the descriptor channel");
  }
  // Take ownership of every descriptor that arrived before judging the packet, so none leaks.
  bool foreign = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        packet.fds.emplace_back(fd);
      }
    } else {
      foreign = true;
    }
  }
  if (got == 0 && packet.fds.empty()) {
    return Status(StatusCode::kOutOfRange, "the peer closed the descriptor channel");
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || foreign) {
    return InvalidArgumentError("a descriptor-channel packet carries at most " +
                                std::to_string(kMaxPacketDescriptors) +
                                " descriptors and no other ancillary data");
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return InvalidArgumentError("a descriptor-channel packet is at most " +
                                std::to_string(kMaxPacketBytes) + " bytes");
  }
  packet.bytes.resize(static_cast<size_t>(got));
  return packet;
}

Status WaitReadable(int socket, int timeout_ms) {
  pollfd p{socket, POLLIN, 0};
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, poll(&p, 1, timeout_ms));
  if (rc < 0) return ErrnoStatus("poll on the descriptor channel");
  if (rc == 0) {
    return DeadlineExceededError("stashd did not answer on the descriptor channel within " +
                                 std::to_string(timeout_ms) + " ms");
  }
  return Status::Ok();
}

}  // namespace stash

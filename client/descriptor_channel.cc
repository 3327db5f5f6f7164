#include "client/descriptor_channel.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

#include "common/descriptor_socket.h"
#include "common/macros.h"
#include "common/sys.h"
#include "stash/v1/descriptor.pb.h"

namespace stash {
namespace {

namespace v1 = stash::v1;

constexpr int kAnswerTimeoutMs = 10000;

}  // namespace

DescriptorChannel::DescriptorChannel(std::string socket, std::string session_id, std::string secret)
    : path_(std::move(socket) + ".fd"),
      session_id_(std::move(session_id)),
      secret_(std::move(secret)) {}

Status DescriptorChannel::ConnectLocked() {
  if (socket_.valid()) return Status::Ok();
  sockaddr_un addr{};
  if (path_.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError("descriptor socket path " + path_ + " is too long");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX, SOCK_SEQPACKET)");
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  if (rc != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return PermissionDeniedError("no permission to connect to stashd's descriptor socket " +
                                   path_ + ": join the socket's group (usually stashd)");
    }
    return UnavailableError(
        ErrnoStatus("stashd's descriptor socket " + path_ + " does not answer", err).message() +
        ": is the daemon still running, and from this release?");
  }
  socket_ = std::move(fd);
  return Status::Ok();
}

Status DescriptorChannel::DepositMemory(uint64_t memory_id, uint64_t bytes, int fd) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id_);
  request.set_session_secret(secret_);
  request.mutable_deposit_memory()->set_memory_id(memory_id);
  request.mutable_deposit_memory()->set_bytes(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  STASH_RETURN_IF_ERROR(ConnectLocked());
  Status status = SendPacket(socket_.get(), request.SerializeAsString(), {fd});
  if (status.ok()) status = WaitReadable(socket_.get(), kAnswerTimeoutMs);
  StatusOr<Packet> answer = status.ok() ? ReceivePacket(socket_.get()) : StatusOr<Packet>(status);
  v1::DescriptorResponse response;
  if (answer.ok() && !response.ParseFromString(answer->bytes)) {
    answer = InternalError("stashd's answer on the descriptor channel does not parse");
  }
  if (!answer.ok()) {
    socket_.reset();  // the next deposit reconnects
    return UnavailableError("cannot hand memory to stashd over " + path_ + ": " +
                            answer.status().message());
  }
  if (response.code() != 0) {
    // The daemon closes the connection after a refusal of the peer or a malformed packet.
    if (response.code() == static_cast<int>(StatusCode::kPermissionDenied) ||
        response.code() == static_cast<int>(StatusCode::kInvalidArgument)) {
      socket_.reset();
    }
    return Status(static_cast<StatusCode>(response.code()),
                  "stashd refused the memory: " + response.message());
  }
  return Status::Ok();
}

}  // namespace stash

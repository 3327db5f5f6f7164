#include "client/session/descriptor_channel.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>

#include "common/descriptor_socket.h"
#include "common/macros.h"
#include "common/sys.h"
#include "stash/v1/descriptor.pb.h"

namespace stash::client {
namespace {

// One packet of stashd's answer. A daemon that refuses a connection (a connection cap) answers
// and closes it; when our request was still unread then, the kernel reports the reset before
// the answer that is queued behind it, so a reset is followed by one look for that answer.
StatusOr<Packet> ReceiveAnswer(int socket) {
  StatusOr<Packet> packet = ReceivePacket(socket);
  if (packet.ok() || packet.status().code() != StatusCode::kOutOfRange) return packet;
  StatusOr<Packet> queued = ReceivePacket(socket, /*nonblocking=*/true);
  return queued.ok() ? std::move(queued) : std::move(packet);
}

namespace v1 = stash::v1;

constexpr int kAnswerTimeoutMs = 10000;

}  // namespace

DescriptorChannel::DescriptorChannel(std::string socket, std::string session_id, std::string secret)
    : path_(std::move(socket) + ".fd"),
      session_id_(std::move(session_id)),
      secret_(std::move(secret)) {}

Status DescriptorChannel::ConnectLocked() {
  // A forked child inherits the connection but is another process: it connects anew.
  if (socket_.valid() && connected_pid_ == getpid()) return Status::Ok();
  socket_.reset();
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
  // Hand memory only to stashd: the process serving the socket must be root or the owner of
  // the socket's directory (who alone can put a socket there).
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return ErrnoStatus("SO_PEERCRED on " + path_);
  }
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path_.substr(0, slash);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return ErrnoStatus("stat " + dir);
  if (peer.uid != 0 && peer.uid != st.st_uid) {
    return PermissionDeniedError(
        "the descriptor socket " + path_ + " is served by uid " + std::to_string(peer.uid) +
        ", neither root nor the owner of its directory (uid " + std::to_string(st.st_uid) +
        "): someone may have put their own socket in stashd's place; not handing memory over. "
        "Make the socket directory writable by its owner only and restart stashd");
  }
  socket_ = std::move(fd);
  connected_pid_ = getpid();
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
  if (!status.ok()) return SendFailedLocked(status);
  status = WaitReadable(socket_.get(), kAnswerTimeoutMs);
  StatusOr<Packet> answer = status.ok() ? ReceiveAnswer(socket_.get()) : StatusOr<Packet>(status);
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

}  // namespace stash::client

namespace stash::client {

Status DescriptorChannel::SendLocked(const std::string& request, const std::vector<int>& fds) {
  STASH_RETURN_IF_ERROR(ConnectLocked());
  Status status = SendPacket(socket_.get(), request, fds);
  if (!status.ok()) return SendFailedLocked(status);
  return Status::Ok();
}

Status DescriptorChannel::SendFailedLocked(const Status& failed) {
  // stashd answers a connection it refuses (a connection cap) before it closes it: the reason
  // may be waiting, and it says more than a broken pipe.
  StatusOr<Packet> answer = ReceivePacket(socket_.get(), /*nonblocking=*/true);
  socket_.reset();  // the next request reconnects
  v1::DescriptorResponse r;
  if (answer.ok() && r.ParseFromString(answer->bytes) && r.code() != 0) {
    return Status(
        static_cast<StatusCode>(r.code()),
        "stashd refused the connection to its descriptor socket " + path_ + ": " + r.message());
  }
  return UnavailableError("stashd's descriptor socket " + path_ + ": " + failed.message());
}

StatusOr<Packet> DescriptorChannel::ReceiveLocked(std::string* bytes) {
  Status status = WaitReadable(socket_.get(), kAnswerTimeoutMs);
  StatusOr<Packet> answer = status.ok() ? ReceiveAnswer(socket_.get()) : StatusOr<Packet>(status);
  if (!answer.ok()) {
    socket_.reset();
    return UnavailableError("no answer from stashd over " + path_ + ": " +
                            answer.status().message());
  }
  *bytes = answer->bytes;
  return answer;
}

StatusOr<LeaseAnswer> DescriptorChannel::Lease(bool automatic,
                                               const std::vector<std::pair<int, uint64_t>>& want) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id_);
  request.set_session_secret(secret_);
  v1::LeaseChunks* lease = request.mutable_lease_chunks();
  lease->set_automatic(automatic);
  for (const auto& [tier, pages] : want) {
    v1::TierPages* w = lease->add_want();
    w->set_tier(static_cast<v1::Tier>(tier));
    w->set_pages(pages);
  }
  std::lock_guard<std::mutex> lock(mu_);
  STASH_RETURN_IF_ERROR(SendLocked(request.SerializeAsString(), {}));
  LeaseAnswer out;
  for (;;) {
    std::string bytes;
    StatusOr<Packet> packet = ReceiveLocked(&bytes);
    if (!packet.ok()) {
      out.status = packet.status();
      return out;  // what came so far, so no descriptor is lost
    }
    v1::DescriptorResponse r;
    if (!r.ParseFromString(bytes)) {
      socket_.reset();
      out.status = UnavailableError("stashd's lease answer on " + path_ + " does not parse");
      return out;
    }
    if (r.more()) {
      if (packet->fds.size() != 1) {
        socket_.reset();
        out.status = UnavailableError("stashd's lease packet on " + path_ + " carries " +
                                      std::to_string(packet->fds.size()) + " descriptors, not 1");
        return out;
      }
      if (r.has_control_block()) {
        out.control_block = std::move(packet->fds[0]);
        out.control_block_bytes = r.control_block().bytes();
      } else if (r.has_group_block()) {
        out.group_block = std::move(packet->fds[0]);
        out.group_block_bytes = r.group_block().bytes();
        out.member_tag = r.group_block().member_tag();
        out.group_pages = r.group_block().pages();
        out.group_chunks = r.group_block().chunks();
        out.group_gpu_uuid = r.group_block().gpu_uuid();
        out.group_tier_first_page.assign(r.group_block().tier_first_page().begin(),
                                         r.group_block().tier_first_page().end());
      } else {
        LeaseAnswer::Chunk c;
        c.id = r.chunk().chunk_id();
        c.tier = r.chunk().tier();
        c.pool = r.chunk().pool();
        c.bytes = r.chunk().bytes();
        c.gpu_uuid = r.chunk().gpu_uuid();
        if (r.chunk().has_group_page()) c.group_page = r.chunk().group_page();
        c.fd = std::move(packet->fds[0]);
        out.chunks.push_back(std::move(c));
      }
      continue;
    }
    out.status = Status(static_cast<StatusCode>(r.code()), r.message());
    for (const v1::TierLease& t : r.lease()) {
      out.lease.push_back({t.tier(), t.chunks(), t.pages(), t.pages_target()});
    }
    out.chunks_not_sent = r.chunks_not_sent();
    return out;
  }
}

StatusOr<uint64_t> DescriptorChannel::Return(const std::vector<uint64_t>& chunk_ids,
                                             const std::string& ended_session) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id_);
  request.set_session_secret(secret_);
  for (uint64_t id : chunk_ids) request.mutable_return_chunks()->add_chunk_ids(id);
  if (chunk_ids.empty()) request.mutable_return_chunks();
  if (!ended_session.empty()) request.mutable_return_chunks()->set_ended_session_id(ended_session);
  std::lock_guard<std::mutex> lock(mu_);
  STASH_RETURN_IF_ERROR(SendLocked(request.SerializeAsString(), {}));
  std::string bytes;
  STASH_ASSIGN_OR_RETURN(Packet packet, ReceiveLocked(&bytes));
  (void)packet;
  v1::DescriptorResponse r;
  if (!r.ParseFromString(bytes)) {
    socket_.reset();
    return UnavailableError("stashd's answer on " + path_ + " does not parse");
  }
  if (r.code() != 0) return Status(static_cast<StatusCode>(r.code()), r.message());
  return r.chunks_returned();
}

}  // namespace stash::client

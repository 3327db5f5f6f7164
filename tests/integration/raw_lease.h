// Mapped mode's protocol spoken raw, as a client library or a hostile client would: a gRPC
// session that says Hello, and LeaseChunks / ReturnChunks packets on the descriptor socket
// (stash/v1/descriptor.proto), for the integration tests of leases on either backend.
#ifndef STASH_TESTS_INTEGRATION_RAW_LEASE_H_
#define STASH_TESTS_INTEGRATION_RAW_LEASE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/descriptor_socket.h"
#include "common/unique_fd.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/harness.h"

namespace stash::testing {

// One raw session on the gRPC socket, welcomed, saying Hello for process `pid`.
class RawSession {
 public:
  RawSession(const std::string& socket, int64_t pid, v1::Mode mode,
             v1::Backend backend = v1::BACKEND_HOST, bool allow_host_spill = false)
      : stub_(v1::StashService::NewStub(
            grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()))) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60 * TimeScale()));
    stream_ = stub_->Session(&ctx_);
    v1::SessionRequest hello;
    hello.mutable_hello()->set_backend(backend);
    hello.mutable_hello()->set_pid(pid);
    hello.mutable_hello()->set_mode(mode);
    hello.mutable_hello()->set_allow_host_spill(allow_host_spill);
    hello.mutable_hello()->set_client_version("raw-lease-test");
    v1::SessionResponse r;
    if (stream_->Write(hello) && stream_->Read(&r) && r.has_welcome()) welcome_ = r.welcome();
  }
  ~RawSession() { Close(); }
  void Close() {
    if (closed_) return;
    closed_ = true;
    stream_->WritesDone();
    v1::SessionResponse r;
    while (stream_->Read(&r)) {
    }
    (void)stream_->Finish();
  }
  const v1::Welcome& welcome() const { return welcome_; }
  v1::SessionResponse Call(v1::SessionRequest request) {
    request.set_request_id(++next_id_);
    v1::SessionResponse r;
    if (!stream_->Write(request) || !stream_->Read(&r)) r.set_code(-1);
    return r;
  }

 private:
  std::unique_ptr<v1::StashService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  v1::Welcome welcome_;
  uint64_t next_id_ = 0;
  bool closed_ = false;
};

// What one LeaseChunks brought, as a client reads it: packets until one without `more`.
struct Lease {
  v1::DescriptorResponse last;
  std::vector<uint64_t> ids;
  std::vector<v1::LeasedChunk> leased;  // as the packets described each chunk
  std::vector<UniqueFd> chunks;
  UniqueFd control;
  bool control_first = false;
};

inline Lease AskLease(int c, const std::string& session_id, const std::string& secret,
                      uint64_t device_pages, uint64_t host_pages = 0) {
  Lease lease;
  lease.last.set_code(-1);
  v1::DescriptorRequest request;
  request.set_session_id(session_id);
  request.set_session_secret(secret);
  v1::TierPages* want = request.mutable_lease_chunks()->add_want();
  want->set_tier(v1::TIER_DEVICE);
  want->set_pages(device_pages);
  if (host_pages > 0) {
    v1::TierPages* host = request.mutable_lease_chunks()->add_want();
    host->set_tier(v1::TIER_HOST);
    host->set_pages(host_pages);
  }
  if (!SendPacket(c, request.SerializeAsString(), {}).ok()) return lease;
  while (true) {
    if (!WaitReadable(c, 10000 * TimeScale()).ok()) return lease;
    auto packet = ReceivePacket(c);
    if (!packet.ok()) return lease;
    v1::DescriptorResponse r;
    if (!r.ParseFromString(packet->bytes)) return lease;
    if (!r.more()) {
      lease.last = r;
      return lease;
    }
    if (packet->fds.size() != 1) return lease;
    if (r.has_control_block()) {
      lease.control_first = lease.chunks.empty();
      lease.control = std::move(packet->fds[0]);
    } else {
      lease.ids.push_back(r.chunk().chunk_id());
      lease.leased.push_back(r.chunk());
      lease.chunks.push_back(std::move(packet->fds[0]));
    }
  }
}

inline int AskReturn(int c, const std::string& session_id, const std::string& secret,
                     const std::vector<uint64_t>& ids, const std::string& ended_session = "") {
  v1::DescriptorRequest request;
  request.set_session_id(session_id);
  request.set_session_secret(secret);
  for (uint64_t id : ids) request.mutable_return_chunks()->add_chunk_ids(id);
  if (!ended_session.empty()) request.mutable_return_chunks()->set_ended_session_id(ended_session);
  if (!SendPacket(c, request.SerializeAsString(), {}).ok()) return -1;
  if (!WaitReadable(c, 10000 * TimeScale()).ok()) return -1;
  auto packet = ReceivePacket(c);
  v1::DescriptorResponse r;
  if (!packet.ok() || !r.ParseFromString(packet->bytes)) return -1;
  return r.code() == 0 && r.chunks_returned() != ids.size() ? -2 : r.code();
}

}  // namespace stash::testing

#endif  // STASH_TESTS_INTEGRATION_RAW_LEASE_H_

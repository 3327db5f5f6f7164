#include "daemon/service.h"

#include <mutex>

#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/write_queue.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

// One session stream. Reads are serialized by gRPC; responses come from pool workers through
// Send() and go out one write at a time, in order.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>,
      public ResponseSink {
 public:
  explicit SessionReactor(DaemonCore* core)
      : core_(core),
        writes_([this](const v1::SessionResponse* r) { StartWrite(r); },
                [this] { MaybeFinish(); }) {
    StartRead(&request_);
  }

  void Send(v1::SessionResponse response) override { writes_.Push(std::move(response)); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side or the connection broke: the lease ends here.
      if (session_ != nullptr) core_->CloseSession(session_);
      EndAfterWrites(grpc::Status::OK);
      return;
    }
    if (session_ == nullptr) {
      if (!request_.has_hello()) {
        EndAfterWrites(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    "the first request of a session must be Hello"));
        return;
      }
      v1::SessionResponse response;
      response.set_request_id(request_.request_id());
      auto session = core_->OpenSession(request_.hello(), this, response.mutable_welcome());
      if (!session.ok()) {
        EndAfterWrites(ToGrpcStatus(session.status()));
        return;
      }
      session_ = std::move(session).value();
      Send(std::move(response));
    } else {
      core_->HandleRequest(session_, std::move(request_));
    }
    request_.Clear();
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override { writes_.OnWriteDone(ok); }

  void OnDone() override {
    if (session_ != nullptr) {
      core_->CloseSession(session_);
      session_->DetachSink();
    }
    delete this;
  }

 private:
  // Finishes the stream with `status` once the write in flight (if any) is done. Responses not
  // yet written are dropped: nobody is reading them.
  void EndAfterWrites(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ending_ = true;
      end_status_ = std::move(status);
    }
    writes_.Close();
    MaybeFinish();
  }

  void MaybeFinish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ending_ || finished_ || writes_.busy()) return;
      finished_ = true;
    }
    Finish(end_status_);
  }

  DaemonCore* const core_;
  v1::SessionRequest request_;        // read side only
  std::shared_ptr<Session> session_;  // set by Hello, read side only
  WriteQueue<v1::SessionResponse> writes_;

  std::mutex mu_;
  bool ending_ = false;    // guarded by mu_
  bool finished_ = false;  // guarded by mu_
  grpc::Status end_status_;
};

class RejectSession final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  RejectSession() {
    Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "sessions are served only on the Unix socket; the TCP listener is "
                        "read-only (stats)"));
  }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* StashServiceImpl::Session(
    grpc::CallbackServerContext* /*context*/) {
  if (!allow_sessions_) return new RejectSession();
  return new SessionReactor(core_);
}

grpc::ServerUnaryReactor* StashServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                     const v1::GetStatsRequest* /*request*/,
                                                     v1::GetStatsResponse* response) {
  *response = core_->Stats();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* StashServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                         const v1::ListSessionsRequest* /*request*/,
                                                         v1::ListSessionsResponse* response) {
  *response = core_->ListSessions();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* StashServiceImpl::GetConfig(grpc::CallbackServerContext* context,
                                                      const v1::GetConfigRequest* /*request*/,
                                                      v1::GetConfigResponse* response) {
  *response = core_->Config();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* StashServiceImpl::Drain(grpc::CallbackServerContext* context,
                                                  const v1::DrainRequest* /*request*/,
                                                  v1::DrainResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (!allow_sessions_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "the TCP listener is read-only: drain over the Unix socket"));
    return reactor;
  }
  core_->Drain();
  response->set_sessions_live(core_->SessionsLive());
  response->set_stashes_live(core_->StashesLive());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace stash::daemon

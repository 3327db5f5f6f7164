#include "daemon/server/service.h"

#include <grpcpp/support/slice.h>

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/text.h"
#include "common/write_queue.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/protocol/wire.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

// The bytes of a received message, in one piece.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// One session stream. Reads are serialized by gRPC; responses come from pool workers through
// Send() and go out one write at a time, in order.
class SessionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                             public ResponseSink {
 public:
  SessionReactor(DaemonCore* core, const PeerCredentials& peer)
      : core_(core),
        peer_(peer),
        writes_([this](const grpc::ByteBuffer* r) { StartWrite(r); }, [this] { MaybeFinish(); }) {
    StartRead(&incoming_);
  }

  void Send(v1::SessionResponse response) override { writes_.Push(Serialize(response)); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side or the connection broke: the lease ends here. The stream
      // ends only once the pool finished every copy and done write of the session: the client
      // raises its pending done counters when the stream ends, and a done write landing after
      // that could move a counter back (a stream waiting on it would hang). The reactor lives
      // until Finish, so `this` outlives the callback.
      if (session_ != nullptr) {
        core_->CloseSession(session_, [this] { EndAfterWrites(grpc::Status::OK); });
      } else {
        EndAfterWrites(grpc::Status::OK);
      }
      return;
    }
    ++received_;
    v1::SessionRequest request;
    if (Status parsed = ParseMessage(Flatten(incoming_), &request); !parsed.ok()) {
      // The stream's framing can no longer be trusted to mean what the client meant: end it,
      // and say why (gRPC's own handler would end it with OK and no reason).
      Log("rpc")->info("session {}: message {} is malformed, ending the stream: {}",
                       session_ != nullptr ? session_->info().id : std::string("(no Hello yet)"),
                       received_, parsed.message());
      if (session_ != nullptr) core_->CloseSession(session_);
      EndAfterWrites(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "message " + std::to_string(received_) +
                                      " of this Session stream is " + parsed.message() +
                                      "; the stream ends here"));
      return;
    }
    incoming_.Clear();
    if (session_ == nullptr) {
      if (!request.has_hello()) {
        EndAfterWrites(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    "the first request of a session must be Hello"));
        return;
      }
      v1::SessionResponse response;
      response.set_request_id(request.request_id());
      auto session = core_->OpenSession(request.hello(), this, response.mutable_welcome(), peer_);
      if (!session.ok()) {
        EndAfterWrites(ToGrpcStatus(session.status()));
        return;
      }
      session_ = std::move(session).value();
      Send(std::move(response));
    } else {
      core_->HandleRequest(session_, std::move(request));
    }
    StartRead(&incoming_);
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
  const PeerCredentials peer_;        // the connection's credentials
  grpc::ByteBuffer incoming_;         // read side only
  uint64_t received_ = 0;             // messages read; read side only
  std::shared_ptr<Session> session_;  // set by Hello, read side only
  WriteQueue<grpc::ByteBuffer> writes_;

  std::mutex mu_;
  bool ending_ = false;    // guarded by mu_
  bool finished_ = false;  // guarded by mu_
  grpc::Status end_status_;
};

class RejectSession final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RejectSession(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// "uid U pid P (command)" of a caller, for log lines about who did what.
std::string DescribePeer(const PeerCredentials& peer) {
  if (!peer.known) return "a caller without credentials";
  std::string command;
  std::ifstream comm("/proc/" + std::to_string(peer.pid) + "/comm");
  std::getline(comm, command);
  return "uid " + std::to_string(peer.uid) + " pid " + std::to_string(peer.pid) + " (" +
         (command.empty() ? std::string("?") : Escaped(command, 64)) + ")";
}

// Finishes a unary call with `status`.
grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, const Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Answers a unary call: parses the request as `Request` (INVALID_ARGUMENT with the reason when
// it is not one), then serializes what `answer` returns.
template <typename Request, typename Answer>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                Answer answer) {
  auto* reactor = context->DefaultReactor();
  Request parsed;
  if (Status s = ParseMessage(Flatten(*request), &parsed); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  if constexpr (std::is_invocable_v<Answer, const Request&>) {
    *response = Serialize(answer(parsed));
  } else {
    *response = Serialize(answer());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace

ConnectionGate::Connection StashServiceImpl::Caller(grpc::CallbackServerContext* context) const {
  if (gate_ == nullptr) return {};
  return gate_->Lookup(context->peer()).value_or(ConnectionGate::Connection{});
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StashServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  if (!allow_sessions_) {
    return new RejectSession(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                          "sessions are served only on the Unix socket; the TCP "
                                          "listener is read-only (stats)"));
  }
  const ConnectionGate::Connection caller = Caller(context);
  if (!caller.refused.ok()) return new RejectSession(ToGrpcStatus(caller.refused));
  if (caller.reserved) {
    // The reserved connections keep stashctl working for root and stashd's user; a session
    // would hold one for as long as it lives.
    return new RejectSession(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "uid " + std::to_string(caller.peer.uid) +
            " holds its whole share of gRPC connections; this one is one of the few kept for "
            "stashctl (health, stats, drain), which serve no session: close connections that "
            "are not used (one per process is enough)"));
  }
  return new SessionReactor(core_, caller.peer);
}

grpc::ServerUnaryReactor* StashServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  if (const Status refused = Caller(context).refused; !refused.ok()) {
    return Refuse(context, refused);
  }
  return Unary<v1::GetStatsRequest>(context, request, response,
                                    [this] { return core_->Stats(session_rows_); });
}

grpc::ServerUnaryReactor* StashServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  if (const Status refused = Caller(context).refused; !refused.ok()) {
    return Refuse(context, refused);
  }
  return Unary<v1::ListSessionsRequest>(context, request, response,
                                        [this] { return core_->ListSessions(session_rows_); });
}

grpc::ServerUnaryReactor* StashServiceImpl::GetConfig(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  if (const Status refused = Caller(context).refused; !refused.ok()) {
    return Refuse(context, refused);
  }
  return Unary<v1::GetConfigRequest>(context, request, response,
                                     [this] { return core_->Config(); });
}

grpc::ServerUnaryReactor* StashServiceImpl::Drain(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  if (!allow_sessions_) {
    return Refuse(context, PermissionDeniedError(
                               "the TCP listener is read-only: drain over the Unix socket"));
  }
  const ConnectionGate::Connection caller = Caller(context);
  if (!caller.refused.ok()) return Refuse(context, caller.refused);
  // Members of the socket's group use stashd; only root and the daemon's own user stop it.
  const uid_t daemon_uid = geteuid();
  if (gate_ != nullptr &&
      (!caller.peer.known || (caller.peer.uid != 0 && caller.peer.uid != daemon_uid))) {
    static RateLimiter refused_log(1, std::chrono::seconds(10));
    uint64_t held = 0;
    if (refused_log.Allow(RateLimiter::Clock::now(), &held)) {
      Log("main")->warn(
          "refused to drain or undrain for {}: not root nor the daemon's user ({} more refused "
          "since the last report)",
          DescribePeer(caller.peer), held);
    }
    const std::string caller_text = caller.peer.known
                                        ? "uid " + std::to_string(caller.peer.uid) + " may use it"
                                        : "this caller's credentials are unknown";
    return Refuse(context,
                  PermissionDeniedError("only root or stashd's own user (uid " +
                                        std::to_string(daemon_uid) + ") may drain or undrain it; " +
                                        caller_text + ": run 'sudo stashctl drain' (or undrain)"));
  }
  const std::string who = DescribePeer(caller.peer);
  return Unary<v1::DrainRequest>(context, request, response,
                                 [this, &who](const v1::DrainRequest& asked) {
                                   if (asked.undrain()) {
                                     core_->Undrain(who);
                                   } else {
                                     core_->Drain(who);
                                   }
                                   v1::DrainResponse answer;
                                   answer.set_sessions_live(core_->SessionsLive());
                                   answer.set_stashes_live(core_->StashesLive());
                                   answer.set_draining(core_->draining());
                                   return answer;
                                 });
}

}  // namespace stash::daemon

// The gRPC edge: thin callback-API handlers that convert requests and call DaemonCore.
//
// The handlers take raw bytes and parse them themselves (daemon/protocol/wire.h), so a malformed
// request is answered INVALID_ARGUMENT with a reason instead of gRPC's silent drop.
#ifndef STASH_DAEMON_SERVICE_H_
#define STASH_DAEMON_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include "daemon/core/core.h"
#include "daemon/server/connection_gate.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::daemon {

// Every method of StashService with raw (ByteBuffer) callback handlers.
using RawStashService = stash::v1::StashService::WithRawCallbackMethod_Session<
    stash::v1::StashService::WithRawCallbackMethod_GetStats<
        stash::v1::StashService::WithRawCallbackMethod_ListSessions<
            stash::v1::StashService::WithRawCallbackMethod_GetConfig<
                stash::v1::StashService::WithRawCallbackMethod_Drain<
                    stash::v1::StashService::Service>>>>>;

class StashServiceImpl final : public RawStashService {
 public:
  // `core` outlives the service. Without `allow_sessions` (the TCP listener) the service is
  // read-only: Session answers PERMISSION_DENIED. Without `session_rows` GetStats and
  // ListSessions carry no per-session rows (no pids, labels or session ids), only their count
  // in `sessions_omitted`. `gate` (may be null: unit tests) is the gate connections come through:
  // calls on a connection it refused are answered with the refusal, and a session's Hello is
  // credited to the connection's Unix user.
  StashServiceImpl(DaemonCore* core, bool allow_sessions, bool session_rows = true,
                   const ConnectionGate* gate = nullptr)
      : core_(core), allow_sessions_(allow_sessions), session_rows_(session_rows), gate_(gate) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  // The caller's connection as the gate knows it (no credentials when it does not).
  ConnectionGate::Connection Caller(grpc::CallbackServerContext* context) const;

  DaemonCore* const core_;  // non-owning
  const bool allow_sessions_;
  const bool session_rows_;
  const ConnectionGate* const gate_;  // non-owning, may be null
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SERVICE_H_

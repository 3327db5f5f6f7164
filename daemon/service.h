// The gRPC edge: thin callback-API handlers that convert requests and call DaemonCore.
#ifndef STASH_DAEMON_SERVICE_H_
#define STASH_DAEMON_SERVICE_H_

#include "daemon/core.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::daemon {

class StashServiceImpl final : public stash::v1::StashService::CallbackService {
 public:
  // `core` outlives the service. Without `allow_sessions` (the TCP listener) the service is
  // read-only: Session answers PERMISSION_DENIED.
  StashServiceImpl(DaemonCore* core, bool allow_sessions)
      : core_(core), allow_sessions_(allow_sessions) {}

  grpc::ServerBidiReactor<stash::v1::SessionRequest, stash::v1::SessionResponse>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const stash::v1::GetStatsRequest* request,
                                     stash::v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const stash::v1::ListSessionsRequest* request,
                                         stash::v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext* context,
                                      const stash::v1::GetConfigRequest* request,
                                      stash::v1::GetConfigResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const stash::v1::DrainRequest* request,
                                  stash::v1::DrainResponse* response) override;

 private:
  DaemonCore* const core_;  // non-owning
  const bool allow_sessions_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SERVICE_H_

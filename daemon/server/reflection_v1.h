// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection) beside the v1alpha service
// gRPC 1.51 brings: grpcurl and other current tools ask v1 first. Answers from protobuf's
// generated descriptor pool, like the v1alpha service.
#ifndef STASH_DAEMON_REFLECTION_V1_H_
#define STASH_DAEMON_REFLECTION_V1_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace stash::daemon {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully qualified names list_services answers with.
  explicit ReflectionV1Service(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  // The answer to one request (tests call it without a server).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_REFLECTION_V1_H_

// The gRPC edge maps stash::Status one to one (the codes share their numbers).
#ifndef STASH_COMMON_GRPC_STATUS_H_
#define STASH_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "common/text.h"
#include "stash/status.h"

namespace stash {

// The message is made valid UTF-8 (common/text.h): it may quote what a client sent.
inline grpc::Status ToGrpcStatus(const Status& status) {
  return {static_cast<grpc::StatusCode>(status.code()), ValidUtf8(status.message())};
}

inline Status FromGrpcStatus(const grpc::Status& status) {
  return {static_cast<StatusCode>(status.error_code()), status.error_message()};
}

}  // namespace stash

#endif  // STASH_COMMON_GRPC_STATUS_H_

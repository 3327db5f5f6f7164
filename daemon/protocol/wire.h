// Parsing what a client sent into a protocol message, and saying why it is not one.
//
// gRPC's generated handlers drop a message that does not parse without a reason (a Session
// stream ended with OK, a unary call answered UNIMPLEMENTED with an empty message). The service
// takes raw bytes instead and parses them here, so a malformed request is answered
// INVALID_ARGUMENT with what is wrong: a truncated field, a string field that is not UTF-8,
// groups nested too deeply, a wire type that does not exist.
#ifndef STASH_DAEMON_WIRE_H_
#define STASH_DAEMON_WIRE_H_

#include <google/protobuf/message.h>

#include <string_view>

#include "stash/status.h"

namespace stash::daemon {

// How deeply messages and groups may nest, as protobuf's own parser allows.
inline constexpr int kMaxWireDepth = 100;

// Parses `bytes` into `out` (cleared first). INVALID_ARGUMENT names the message type and the
// first problem found, with its byte offset; the message never quotes the bytes.
Status ParseMessage(std::string_view bytes, google::protobuf::Message* out);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_WIRE_H_

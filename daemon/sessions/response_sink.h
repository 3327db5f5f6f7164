// Where a session's responses go: its stream.
#ifndef STASH_DAEMON_RESPONSE_SINK_H_
#define STASH_DAEMON_RESPONSE_SINK_H_

#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// Where responses go: the session's stream. Send never blocks.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Send(stash::v1::SessionResponse response) = 0;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_RESPONSE_SINK_H_

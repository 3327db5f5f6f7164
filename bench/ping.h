// The raw gRPC baseline of stash-bench: a Ping service (bench/ping.proto) served on a Unix
// socket with the callback API (as stashd serves), and the clients that measure it.
#ifndef STASH_BENCH_PING_H_
#define STASH_BENCH_PING_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "bench/ping.grpc.pb.h"
#include "stash/status.h"

namespace stash::bench {

// Serves Ping on `socket_path` until stdin reaches EOF (the parent closed it) or SIGTERM.
// Prints "ready" on stdout once serving. Returns the process exit code.
int RunPingServer(const std::string& socket_path);

// A channel to a Unix socket, connected (or UNAVAILABLE after `timeout_ms`).
StatusOr<std::shared_ptr<grpc::Channel>> ConnectUnix(const std::string& socket_path,
                                                     int timeout_ms);

// One bidirectional EchoStream used as ping-pong: the transport floor of a stash.v1 Session
// request (callback reactor, answers matched on a condition variable, as the client library
// does). Thread-compatible: one caller at a time.
class StreamPinger final
    : public grpc::ClientBidiReactor<stashbench::v1::PingMessage, stashbench::v1::PingMessage> {
 public:
  explicit StreamPinger(stashbench::v1::Ping::Stub* stub);
  ~StreamPinger() override;  // half-closes and waits for the stream to end

  // One round trip; false when the stream broke.
  bool Ping(uint64_t id);

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  grpc::ClientContext context_;
  stashbench::v1::PingMessage out_;
  stashbench::v1::PingMessage in_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_done_ = true;  // guarded by mu_
  uint64_t reads_ = 0;      // guarded by mu_
  bool broken_ = false;     // guarded by mu_
  bool done_ = false;       // guarded by mu_
};

}  // namespace stash::bench

#endif  // STASH_BENCH_PING_H_

#include "bench/ping.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace stash::bench {
namespace {

namespace pb = stashbench::v1;

// Echoes every message of one stream, one at a time.
class EchoStreamReactor final : public grpc::ServerBidiReactor<pb::PingMessage, pb::PingMessage> {
 public:
  EchoStreamReactor() { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&message_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  pb::PingMessage message_;
};

class PingService final : public pb::Ping::CallbackService {
 public:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const pb::PingMessage* request,
                                 pb::PingMessage* response) override {
    response->set_id(request->id());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<pb::PingMessage, pb::PingMessage>* EchoStream(
      grpc::CallbackServerContext* /*context*/) override {
    return new EchoStreamReactor();
  }
};

}  // namespace

int RunPingServer(const std::string& socket_path) {
  // SIGTERM and stdin EOF both end the server; a thread waits for either.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  PingService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "ping server: cannot serve on %s\n", socket_path.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);

  std::thread stdin_watch([] {
    char buf[64];
    while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
    }
    kill(getpid(), SIGTERM);
  });
  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  stdin_watch.detach();  // blocked in read(); the process exits now
  unlink(socket_path.c_str());
  return 0;
}

StatusOr<std::shared_ptr<grpc::Channel>> ConnectUnix(const std::string& socket_path,
                                                     int timeout_ms) {
  auto channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(timeout_ms))) {
    return UnavailableError("cannot connect to " + socket_path);
  }
  return channel;
}

StreamPinger::StreamPinger(pb::Ping::Stub* stub) {
  stub->async()->EchoStream(&context_, this);
  StartRead(&in_);
  AddHold();
  StartCall();
}

StreamPinger::~StreamPinger() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return write_done_ || broken_; });
  }
  StartWritesDone();
  RemoveHold();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

bool StreamPinger::Ping(uint64_t id) {
  uint64_t want = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // The previous write's completion may trail its answer: never start two writes at once.
    cv_.wait(lock, [&] { return write_done_ || broken_; });
    if (broken_) return false;
    write_done_ = false;
    want = reads_ + 1;
  }
  out_.set_id(id);
  StartWrite(&out_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return reads_ >= want || broken_; });
  return !broken_;
}

void StreamPinger::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  write_done_ = true;
  if (!ok) broken_ = true;
  cv_.notify_all();
}

void StreamPinger::OnReadDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      broken_ = true;
      cv_.notify_all();
      return;
    }
    ++reads_;
    cv_.notify_all();
  }
  StartRead(&in_);
}

void StreamPinger::OnDone(const grpc::Status& /*status*/) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  broken_ = true;
  cv_.notify_all();
}

}  // namespace stash::bench

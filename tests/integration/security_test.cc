// Issue-12 attacks against the real stashd, as a hostile local client would make them: client
// memory travels only as sealed memfds over the descriptor channel, which only the process that
// holds a session can use for it (docs/security.md).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/descriptor_socket.h"
#include "common/host_event.h"
#include "common/shm.h"
#include "stash/client.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash::testing {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kBytes = 1 << 20;

std::vector<std::string> Flags() {
  return {"--pool-bytes=8MiB", "--page-bytes=64KiB", "--host-tier-bytes=0", "--backend=host"};
}

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

// One raw session on the gRPC socket, welcomed.
class RawSession {
 public:
  explicit RawSession(const std::string& socket)
      : stub_(v1::StashService::NewStub(
            grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()))) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60 * TimeScale()));
    stream_ = stub_->Session(&ctx_);
    v1::SessionRequest hello;
    hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
    hello.mutable_hello()->set_pid(getpid());
    hello.mutable_hello()->set_client_version("security-test");
    v1::SessionResponse r;
    if (stream_->Write(hello) && stream_->Read(&r) && r.has_welcome()) welcome_ = r.welcome();
  }
  ~RawSession() {
    stream_->WritesDone();
    v1::SessionResponse r;
    while (stream_->Read(&r)) {
    }
    (void)stream_->Finish();
  }
  const v1::Welcome& welcome() const { return welcome_; }

  // Waits (up to 10 s) until the daemon has admitted and queued `n` requests of this session.
  bool AwaitInflight(uint64_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10 * TimeScale());
    while (std::chrono::steady_clock::now() < until) {
      grpc::ClientContext ctx;
      v1::GetStatsResponse stats;
      if (stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok()) {
        for (const v1::SessionStats& row : stats.sessions()) {
          if (row.session_id() == welcome_.session_id() && row.requests_inflight() >= n) {
            return true;
          }
        }
      }
      usleep(1000);
    }
    return false;
  }

  // Sends one request and returns its answer.
  v1::SessionResponse Call(v1::SessionRequest request) {
    request.set_request_id(++next_id_);
    v1::SessionResponse r;
    if (!stream_->Write(request) || !stream_->Read(&r)) r.set_code(-1);
    return r;
  }
  // Writes `requests` at once, runs `meanwhile`, then reads `answers` answers, in request order
  // (answers come in completion order).
  std::vector<v1::SessionResponse> Pipeline(std::vector<v1::SessionRequest> requests,
                                            size_t answers,
                                            const std::function<void()>& meanwhile) {
    std::vector<uint64_t> ids;
    for (v1::SessionRequest& r : requests) {
      r.set_request_id(++next_id_);
      ids.push_back(r.request_id());
      if (!stream_->Write(r)) return {};
    }
    pipelined_.insert(pipelined_.end(), ids.begin(), ids.end());
    return Collect(answers, meanwhile);
  }
  // Runs `meanwhile`, then reads `n` answers of pipelined requests, in request order.
  std::vector<v1::SessionResponse> Collect(size_t n, const std::function<void()>& meanwhile) {
    meanwhile();
    std::vector<v1::SessionResponse> got(n);
    for (v1::SessionResponse& a : got) {
      if (!stream_->Read(&a)) return {};
    }
    std::vector<v1::SessionResponse> ordered;
    for (uint64_t id : pipelined_) {
      for (const v1::SessionResponse& a : got) {
        if (a.request_id() == id) ordered.push_back(a);
      }
    }
    return ordered;
  }
  v1::SessionResponse Register(uint64_t id, uint64_t bytes, int kind = v1::MEMORY_KIND_HOST_FD,
                               const std::string& handle = "") {
    v1::SessionRequest r;
    r.mutable_register_memory()->set_memory_id(id);
    r.mutable_register_memory()->set_kind(static_cast<v1::MemoryKind>(kind));
    r.mutable_register_memory()->set_bytes(bytes);
    r.mutable_register_memory()->set_handle(handle);
    return Call(r);
  }
  // Stashes `rows` rows of 4 KiB of memory `id` (from offset 0) and reloads them into memory
  // `into`; returns the reload's answer.
  v1::SessionResponse RoundTrip(uint64_t id, uint64_t into, uint64_t rows) {
    v1::SessionRequest st;
    st.mutable_stash()->set_ticket(0x7777);
    st.mutable_stash()->mutable_source()->set_memory_id(id);
    st.mutable_stash()->set_row_bytes(4096);
    st.mutable_stash()->set_max_rows(rows);
    st.mutable_stash()->mutable_count()->set_value(rows);
    v1::SessionResponse stashed = Call(st);
    if (stashed.code() != 0) return stashed;
    v1::SessionRequest rl;
    rl.mutable_reload()->set_ticket(0x7777);
    rl.mutable_reload()->mutable_destination()->set_memory_id(into);
    return Call(rl);
  }

 private:
  std::unique_ptr<v1::StashService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  v1::Welcome welcome_;
  uint64_t next_id_ = 0;
  std::vector<uint64_t> pipelined_;
};

std::string DepositPacket(const v1::Welcome& welcome, uint64_t id, uint64_t bytes,
                          const std::string* secret = nullptr) {
  v1::DescriptorRequest request;
  request.set_session_id(welcome.session_id());
  request.set_session_secret(secret != nullptr ? *secret : welcome.descriptor_secret());
  request.mutable_deposit_memory()->set_memory_id(id);
  request.mutable_deposit_memory()->set_bytes(bytes);
  return request.SerializeAsString();
}

// Sends one packet with `fds` on a fresh connection to the descriptor socket at `fd_path` and
// returns the answer (code -1 when none came). Syscalls and protobuf only: safe in a child
// forked from a gRPC process.
v1::DescriptorResponse Ask(const std::string& fd_path, const std::string& packet,
                           const std::vector<int>& fds) {
  v1::DescriptorResponse response;
  response.set_code(-1);
  UniqueFd c = ConnectUnix(fd_path);
  if (!c.valid() || !SendPacket(c.get(), packet, fds).ok() ||
      !WaitReadable(c.get(), 10000 * TimeScale()).ok()) {
    return response;
  }
  auto answer = ReceivePacket(c.get());
  if (answer.ok()) response.ParseFromString(answer->bytes);
  return response;
}

// The same to the descriptor socket of the daemon on `socket`.
v1::DescriptorResponse Send(const std::string& socket, const std::string& packet,
                            const std::vector<int>& fds) {
  return Ask(socket + ".fd", packet, fds);
}

// Runs `body` in a forked child (another process, optionally another user) and returns what it
// returned; INT_MIN when the child could not report.
int InChild(const std::function<int()>& body) {
  int result[2];
  if (pipe2(result, O_CLOEXEC) != 0) return INT_MIN;
  const pid_t child = fork();
  if (child < 0) return INT_MIN;
  if (child == 0) {
    const int code = body();
    (void)!write(result[1], &code, sizeof(code));
    _exit(0);
  }
  close(result[1]);
  int code = INT_MIN;
  if (read(result[0], &code, sizeof(code)) != static_cast<ssize_t>(sizeof(code))) code = INT_MIN;
  close(result[0]);
  waitpid(child, nullptr, 0);
  return code;
}

size_t StashdFilesInDevShm() {
  size_t n = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "stashd", 6) == 0) ++n;
  }
  closedir(dir);
  return n;
}

constexpr int kPermissionDenied = static_cast<int>(grpc::StatusCode::PERMISSION_DENIED);
constexpr int kInvalidArgument = static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
constexpr int kFailedPrecondition = static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION);

TEST(Security, OwnMemoryByDescriptorRoundTrips) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  ASSERT_EQ(s.welcome().descriptor_secret().size(), 32U);
  auto source = SharedMemory::CreateSealed("security-test", kBytes);
  auto target = SharedMemory::CreateSealed("security-test", kBytes);
  ASSERT_TRUE(source.ok() && target.ok());
  std::memset((*source)->data(), 0x3c, kBytes);
  EXPECT_EQ(Send(daemon.socket(), DepositPacket(s.welcome(), 1, kBytes), {(*source)->fd()}).code(),
            0);
  EXPECT_EQ(Send(daemon.socket(), DepositPacket(s.welcome(), 2, kBytes), {(*target)->fd()}).code(),
            0);
  ASSERT_EQ(s.Register(1, kBytes).code(), 0);
  ASSERT_EQ(s.Register(2, kBytes).code(), 0);
  const v1::SessionResponse r = s.RoundTrip(1, 2, 16);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ((*target)->data()[16 * 4096 - 1], 0x3c);
}

// Item 1: memory is never named, so a session can reach only the descriptors it handed over.
TEST(Security, NoSessionCanNameAnotherClientsMemory) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession victim(daemon.socket());
  RawSession attacker(daemon.socket());
  auto secret = SharedMemory::CreateSealed("security-test", kBytes);
  ASSERT_TRUE(secret.ok());
  ASSERT_EQ(
      Send(daemon.socket(), DepositPacket(victim.welcome(), 9, kBytes), {(*secret)->fd()}).code(),
      0);
  // The old attack: a shm name (there is none to find: no stashd files in /dev/shm).
  const v1::SessionResponse by_name =
      attacker.Register(9, kBytes, 1, "/stashd-" + std::to_string(getpid()) + "-0123");
  EXPECT_EQ(by_name.code(), kInvalidArgument);
  EXPECT_THAT(by_name.message(), HasSubstr("removed"));
  // The victim's memory id in the attacker's session: no descriptor there.
  const v1::SessionResponse by_id = attacker.Register(9, kBytes);
  EXPECT_EQ(by_id.code(), kFailedPrecondition) << by_id.message();
  EXPECT_THAT(by_id.message(), HasSubstr("no descriptor was deposited"));
  // Depositing into the victim's session needs its secret.
  auto own = SharedMemory::CreateSealed("security-test", kBytes);
  const std::string guess(32, 'g');
  const v1::DescriptorResponse wrong =
      Send(daemon.socket(), DepositPacket(victim.welcome(), 5, kBytes, &guess), {(*own)->fd()});
  EXPECT_EQ(wrong.code(), kPermissionDenied) << wrong.message();
  // The victim's session still reads its own memory.
  ASSERT_EQ(victim.Register(9, kBytes).code(), 0);
}

// Item 1: a leaked secret is not enough: the descriptor channel serves a session only to the
// process that said its Hello.
TEST(Security, AnotherProcessWithTheSecretIsRefused) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  auto memory = SharedMemory::CreateSealed("security-test", kBytes);
  ASSERT_TRUE(memory.ok());
  const std::string packet = DepositPacket(s.welcome(), 3, kBytes);
  const std::string path = daemon.socket() + ".fd";
  // Another process (a child: its pid is not the Hello's) with the right secret.
  const int code = InChild([&] { return Ask(path, packet, {memory.value()->fd()}).code(); });
  EXPECT_EQ(code, kPermissionDenied);
  EXPECT_EQ(s.Register(3, kBytes).code(), kFailedPrecondition);  // nothing was deposited
  // The session's own process is still served.
  EXPECT_EQ(Send(daemon.socket(), packet, {(*memory)->fd()}).code(), 0);
  EXPECT_EQ(s.Register(3, kBytes).code(), 0);
}

// Item 2: memory that can shrink under the daemon's mapping (SIGBUS) is refused at the door.
TEST(Security, MemoryThatCouldShrinkIsRefusedAndTheDaemonStaysUp) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  UniqueFd unsealed(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(unsealed.get(), kBytes), 0);
  const v1::DescriptorResponse r =
      Send(daemon.socket(), DepositPacket(s.welcome(), 4, kBytes), {unsealed.get()});
  EXPECT_EQ(r.code(), kInvalidArgument);
  EXPECT_THAT(r.message(), HasSubstr("F_SEAL_SHRINK"));
  EXPECT_EQ(s.Register(4, kBytes).code(), kFailedPrecondition);
  // A sealed memfd smaller than it claims is refused too.
  auto small = SharedMemory::CreateSealed("security-test", 4096);
  const v1::DescriptorResponse smaller =
      Send(daemon.socket(), DepositPacket(s.welcome(), 5, kBytes), {(*small)->fd()});
  EXPECT_EQ(smaller.code(), kInvalidArgument);
  EXPECT_THAT(smaller.message(), HasSubstr("less than"));
  EXPECT_TRUE(daemon.process().running());
  EXPECT_TRUE(SocketAccepts(daemon.socket()));
}

TEST(Security, MalformedDescriptorPacketsAreAnsweredAndCloseTheConnection) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  auto memory = SharedMemory::CreateSealed("security-test", kBytes);
  const std::vector<std::string> bad = {std::string("\xff\xff\xff\xff", 4), "",
                                        DepositPacket(s.welcome(), 0, kBytes)};
  for (const std::string& packet : bad) {
    const v1::DescriptorResponse r = Send(daemon.socket(), packet, {(*memory)->fd()});
    EXPECT_EQ(r.code(), kInvalidArgument) << r.message();
  }
  // Two descriptors where one is expected.
  const v1::DescriptorResponse two = Send(daemon.socket(), DepositPacket(s.welcome(), 6, kBytes),
                                          {(*memory)->fd(), (*memory)->fd()});
  EXPECT_EQ(two.code(), kInvalidArgument);
  EXPECT_THAT(two.message(), HasSubstr("exactly one descriptor"));
  EXPECT_TRUE(daemon.process().running());
}

// Review: a Register that fails must not undo a later Register of the same id (admitted after
// an Unregister meanwhile), or that memory is mapped uncounted and cannot be unregistered.
TEST(Security, AFailedRegistrationUndoesOnlyItself) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  auto events = SharedMemory::CreateSealed("security-test", 4096);
  auto x = SharedMemory::CreateSealed("security-test", kBytes);
  ASSERT_TRUE(events.ok() && x.ok());
  ASSERT_EQ(Send(daemon.socket(), DepositPacket(s.welcome(), 1, 4096), {(*events)->fd()}).code(),
            0);
  ASSERT_EQ(s.Register(1, 4096).code(), 0);
  // Hold the pool behind a stash whose ready event is not signalled yet, then queue: Register X
  // (no descriptor: it will fail), Unregister X, Register X (its descriptor comes in time).
  auto held = [](uint64_t ticket, uint64_t ready) {
    v1::SessionRequest r;
    r.mutable_stash()->set_ticket(ticket);
    r.mutable_stash()->mutable_source()->set_memory_id(1);
    r.mutable_stash()->set_row_bytes(8);
    r.mutable_stash()->set_max_rows(8);
    r.mutable_stash()->mutable_count()->set_value(8);
    r.mutable_stash()->mutable_ready()->mutable_counter()->set_memory_id(1);
    r.mutable_stash()->mutable_ready()->mutable_counter()->set_offset(2048);
    r.mutable_stash()->mutable_ready()->set_value(ready);
    return r;
  };
  v1::SessionRequest reg;
  reg.mutable_register_memory()->set_memory_id(2);
  reg.mutable_register_memory()->set_kind(v1::MEMORY_KIND_HOST_FD);
  reg.mutable_register_memory()->set_bytes(kBytes);
  v1::SessionRequest unreg;
  unreg.mutable_unregister_memory()->set_memory_id(2);
  uint64_t* ready = reinterpret_cast<uint64_t*>((*events)->data() + 2048);
  // All five are admitted at once: X is declared, undeclared, declared again.
  std::vector<v1::SessionResponse> answers =
      s.Pipeline({held(0x91, 1), reg, unreg, held(0x92, 2), reg}, 3, [&] {
        // Once all five are admitted (the Unregister and second Register included), the first
        // Register runs, without a descriptor: it fails.
        ASSERT_TRUE(s.AwaitInflight(5));
        EventSignal(ready, 1);
      });
  ASSERT_EQ(answers.size(), 3U);
  EXPECT_EQ(answers[1].code(), kFailedPrecondition) << answers[1].message();
  EXPECT_EQ(answers[2].code(), 0) << answers[2].message();
  answers = s.Collect(2, [&] {
    EXPECT_EQ(Send(daemon.socket(), DepositPacket(s.welcome(), 2, kBytes), {(*x)->fd()}).code(), 0);
    EventSignal(ready, 2);  // the second Register runs now, with its descriptor
  });
  ASSERT_EQ(answers.size(), 2U);
  for (const v1::SessionResponse& a : answers) {
    EXPECT_EQ(a.code(), 0) << a.message();
  }
  // The second registration stands: it can be unregistered (and only once).
  v1::SessionResponse r = s.Call(unreg);
  EXPECT_EQ(r.code(), 0) << r.message();
  r = s.Call(unreg);
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND)) << r.message();
}

// Review: a descriptor whose close blocks (a socket lingering on unsent data) must not freeze
// the descriptor server for everyone else.
TEST(Security, ADescriptorWhoseCloseBlocksDoesNotStopTheServer) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  // A loopback TCP connection whose peer never reads, its send buffer full, lingering 60 s:
  // longer than the 10 s a deposit below waits for its answer.
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 1), 0);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  UniqueFd sender(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ASSERT_TRUE(connect(sender.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
              errno == EINPROGRESS);
  UniqueFd receiver(accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(receiver.valid());
  const std::string chunk(1 << 16, 'x');
  for (int i = 0; i < 4096 && send(sender.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0;
       ++i) {
  }
  linger lin{1, 60};
  ASSERT_EQ(setsockopt(sender.get(), SOL_SOCKET, SO_LINGER, &lin, sizeof(lin)), 0);
  ASSERT_EQ(fcntl(sender.get(), F_SETFL, 0), 0);  // blocking: close() waits out the linger
  // Hand it over and let go of our copy while it is still in flight (the daemon stopped), so
  // that the daemon's close is the last one: the one that waits out the linger.
  ASSERT_EQ(kill(daemon.process().pid(), SIGSTOP), 0);
  // Else a thread still running may serve the packet before sender.reset() below, which then
  // is the last close and waits out the linger itself.
  ASSERT_TRUE(testing::AllThreadsStopped(daemon.process().pid()));
  UniqueFd c = ConnectUnix(daemon.socket() + ".fd");
  ASSERT_TRUE(c.valid());
  ASSERT_TRUE(SendPacket(c.get(), "garbage", {sender.get()}).ok());
  sender.reset();
  ASSERT_EQ(kill(daemon.process().pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitReadable(c.get(), 10000 * TimeScale()).ok());
  // The server still serves a good deposit at once.
  auto memory = SharedMemory::CreateSealed("security-test", kBytes);
  EXPECT_EQ(Send(daemon.socket(), DepositPacket(s.welcome(), 3, kBytes), {(*memory)->fd()}).code(),
            0);
  EXPECT_EQ(s.Register(3, kBytes).code(), 0);
}

// Review: one user cannot take every descriptor-channel connection.
TEST(Security, ConnectionsPerUserAreLimited) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  std::vector<UniqueFd> held;
  for (int i = 0; i < 64; ++i) {
    held.push_back(ConnectUnix(daemon.socket() + ".fd"));
    ASSERT_TRUE(held.back().valid());
  }
  // The next connection is answered and closed without being asked anything.
  UniqueFd extra = ConnectUnix(daemon.socket() + ".fd");
  ASSERT_TRUE(extra.valid());
  ASSERT_TRUE(WaitReadable(extra.get(), 10000 * TimeScale()).ok());
  auto packet = ReceivePacket(extra.get());
  ASSERT_TRUE(packet.ok()) << packet.status().ToString();
  v1::DescriptorResponse refused;
  ASSERT_TRUE(refused.ParseFromString(packet->bytes));
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(refused.message(), HasSubstr("64 per user"));
  // A client over the cap reads the cap's reason where it needs the channel, not a broken pipe:
  // the answer of the stash whose memory could not be handed over. Once connections close it is
  // served again.
  Options o;
  o.socket = daemon.socket();
  auto client = Client::Open(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto memory = HostBuffer::Allocate(kBytes);
  ASSERT_TRUE(memory.ok());
  StashArgs args;
  args.source = memory->get();
  args.row_bytes = 4096;
  args.max_rows = kBytes / 4096;
  args.count.value = args.max_rows;
  const auto queued = (*client)->Stash(args);
  ASSERT_TRUE(queued.ok()) << queued.status().ToString();
  const auto over = (*client)->Wait(*queued);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
  EXPECT_THAT(over.status().message(), HasSubstr("64 per user"));
  EXPECT_THAT(over.status().message(), Not(HasSubstr("Broken pipe")));
  held.clear();  // the server notices the closes at once; a retry covers the race
  Status last = over.status();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10 * TimeScale());
  while (!last.ok() && std::chrono::steady_clock::now() < until) {
    const auto ticket = (*client)->Stash(args);
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    last = (*client)->Wait(*ticket).status();
  }
  EXPECT_TRUE(last.ok()) << last.ToString();
}

// Review: a client hands memory only to a descriptor socket served by root or by the owner of
// the socket's directory, never to one another user put in stashd's place.
TEST(Security, TheClientRefusesADescriptorSocketServedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a second Unix user";
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Options options;
  options.socket = daemon.socket();
  auto client = Client::Open(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // The impostor: a socket in the real one's place, listening as uid 65534.
  const std::string path = daemon.socket() + ".fd";
  ASSERT_EQ(rename(path.c_str(), (path + ".real").c_str()), 0);
  UniqueFd impostor(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(impostor.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char ok = 0;
    if (setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0 &&
        listen(impostor.get(), 8) == 0) {
      ok = 1;
    }
    (void)!write(ready[1], &ok, 1);
    while (true) {
      const int c = accept(impostor.get(), nullptr, nullptr);
      if (c < 0) _exit(0);
    }
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  ASSERT_EQ(ok, 1) << "could not listen as uid 65534";
  auto buffer = HostBuffer::Allocate(1 << 16);
  ASSERT_TRUE(buffer.ok());
  StashArgs args;
  args.source = buffer->get();
  args.row_bytes = 64;
  args.max_rows = 16;
  args.count.value = 16;
  auto ticket = (*client)->Stash(args);
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();  // queued; the writer meets the impostor
  auto answer = (*client)->Wait(*ticket);
  EXPECT_EQ(answer.status().code(), StatusCode::kPermissionDenied) << answer.status().ToString();
  EXPECT_THAT(answer.status().message(), HasSubstr("in stashd's place"));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// Item 11: client memory has no name, so a SIGKILLed client leaves nothing in /dev/shm.
TEST(Security, KilledClientsLeaveNothingInDevShm) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  const size_t before = StashdFilesInDevShm();
  Process client;
  ASSERT_TRUE(client.Start({BinDir() + "/tests/integration/stash-test-client", daemon.socket(),
                            "hold", std::to_string(64 << 10)},
                           daemon.dir() + "/client"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30 * TimeScale());
  while (client.Stdout().find("stashed") == std::string::npos && client.running() &&
         std::chrono::steady_clock::now() < deadline) {
    usleep(10000);
  }
  ASSERT_THAT(client.Stdout(), HasSubstr("stashed")) << client.Stderr();
  EXPECT_EQ(StashdFilesInDevShm(), before);
  client.StopWith(SIGKILL, std::chrono::seconds(10));
  EXPECT_EQ(StashdFilesInDevShm(), before);
}

// Item 1 across Unix users (needs root to become another user): a second user allowed on the
// sockets (group member) still cannot use a session of the first.
TEST(Security, AnotherUserInTheSocketsGroupCannotUseAnotherUsersSession) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a second Unix user";
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession s(daemon.socket());
  constexpr gid_t kNobody = 65534;
  const std::string path = daemon.socket() + ".fd";
  // Let group 65534 onto both sockets, as the stashd group would be.
  ASSERT_EQ(chown(daemon.dir().c_str(), static_cast<uid_t>(-1), kNobody), 0);
  ASSERT_EQ(chmod(daemon.dir().c_str(), 0750), 0);
  ASSERT_EQ(chown(path.c_str(), static_cast<uid_t>(-1), kNobody), 0);
  const std::string packet = DepositPacket(s.welcome(), 8, kBytes);  // even with the secret
  const int code = InChild([&] {
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) return -2;
    UniqueFd memfd(memfd_create("nobody", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (ftruncate(memfd.get(), kBytes) != 0 ||
        fcntl(memfd.get(), F_ADD_SEALS, static_cast<int>(kClientMemorySeals)) != 0) {
      return -3;
    }
    return Ask(path, packet, {memfd.get()}).code();
  });
  ASSERT_NE(code, -2) << "could not become uid 65534";
  ASSERT_NE(code, -1) << "uid 65534 could not reach the descriptor socket";
  EXPECT_EQ(code, kPermissionDenied);
  EXPECT_EQ(s.Register(8, kBytes).code(), kFailedPrecondition);
}

// Says one Hello with `group` and `secret` on a raw stream and returns how the stream ended
// (OK with a Welcome when the daemon took it).
grpc::Status RawGroupHello(const std::string& socket, const std::string& group,
                           const std::string& secret) {
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30 * TimeScale()));
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_group(group);
  hello.mutable_hello()->set_group_secret(secret);
  v1::SessionResponse r;
  const bool welcomed = stream->Write(hello) && stream->Read(&r) && r.has_welcome();
  stream->WritesDone();
  while (stream->Read(&r)) {
  }
  grpc::Status status = stream->Finish();
  if (welcomed && !status.ok())
    return grpc::Status(grpc::StatusCode::INTERNAL, "welcomed, then " + status.error_message());
  return status;
}

// Issue 41: a group is joined only with the secret its first member set. A wrong secret is
// PERMISSION_DENIED at Open (the stream ends, no session is made) and the first member goes on
// as before; malformed group fields are INVALID_ARGUMENT. (Another uid is refused too: the
// registry's and the core's tests drive that with the peer's credentials.)
TEST(Security, AGroupIsJoinedOnlyWithTheSecretItsFirstMemberSet) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Options options;
  options.socket = daemon.socket();
  options.group = "job.41";
  options.group_secret = std::string(32, '\x01');
  auto first = Client::Open(options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();

  Options wrong = options;
  wrong.group_secret[31] = '\x02';  // only the last byte differs
  auto refused = Client::Open(wrong);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("wrong group secret for group job.41"));
  EXPECT_EQ(RawGroupHello(daemon.socket(), "job.41", std::string(32, 'x')).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(DaemonStats(daemon.socket()).sessions_size(), 1);

  // The first member is unaffected: its stashes round-trip.
  auto src = Buffer(64 << 10, 41);
  auto dst = Buffer(64 << 10);
  auto stashed = (*first)->StashAndWait(Args(*src, 4096, 16));
  ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
  ReloadArgs reload;
  reload.ticket = stashed->ticket;
  reload.destination = dst.get();
  auto reloaded = (*first)->ReloadAndWait(reload);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 16 * 4096), 0);

  // The right secret joins; stats name the group of both and of no other session.
  auto second = Client::Open(options);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  Options plain;
  plain.socket = daemon.socket();
  auto alone = Client::Open(plain);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  int in_group = 0;
  const v1::GetStatsResponse stats = DaemonStats(daemon.socket());
  for (const v1::SessionStats& row : stats.sessions()) {
    if (row.has_group()) {
      EXPECT_EQ(row.group(), "job.41");
      ++in_group;
    }
  }
  EXPECT_EQ(in_group, 2);

  // Shapes: the daemon refuses them on a raw stream, the library before it connects.
  for (const auto& [group, secret] : std::vector<std::pair<std::string, std::string>>{
           {"job 41", std::string(32, 's')},
           {std::string(129, 'g'), std::string(32, 's')},
           {"job.41", std::string(31, 's')},
           {"job.41", ""},
           {"", std::string(32, 's')}}) {
    const grpc::Status s = RawGroupHello(daemon.socket(), group, secret);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << group.size() << " " << secret.size() << ": " << s.error_message();
  }
  Options bad_name = options;
  bad_name.group = "job/41";
  auto named = Client::Open(bad_name);
  EXPECT_EQ(named.status().code(), StatusCode::kInvalidArgument) << named.status().ToString();
  EXPECT_THAT(named.status().message(), HasSubstr("A-Z a-z 0-9 . _ : @ + -"));
  Options short_secret = options;
  short_secret.group_secret.resize(16);
  EXPECT_EQ(Client::Open(short_secret).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DaemonStats(daemon.socket()).sessions_size(), 3);
}

// Issue 20: a registration refused for a limit fails the operation that needed it with that
// limit's reason, never a later "not registered".
TEST(Security, ARegistrationRefusedForALimitFailsTheStashWithThatLimitsReason) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Options o;
  o.socket = daemon.socket();
  auto client = Client::Open(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Every buffer a stash names is one registration; a session may hold 4096.
  std::vector<std::unique_ptr<HostBuffer>> buffers;
  StatusOr<Completion> last = InternalError("no stash ran");
  for (int i = 0; i <= 4096; ++i) {
    auto buffer = HostBuffer::Allocate(4096);
    ASSERT_TRUE(buffer.ok());
    StashArgs args;
    args.source = buffer->get();
    args.row_bytes = 4096;
    args.max_rows = 1;
    args.count.value = 0;  // no rows: no pages, only the registration
    auto ticket = (*client)->Stash(args);
    ASSERT_TRUE(ticket.ok()) << i << ": " << ticket.status().ToString();
    last = (*client)->Wait(*ticket);
    buffers.push_back(std::move(buffer).value());
    if (!last.ok()) {
      EXPECT_EQ(i, 4096);
      break;
    }
  }
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), StatusCode::kResourceExhausted) << last.status().ToString();
  EXPECT_THAT(last.status().message(), HasSubstr("registered allocations, the limit per session"));
  EXPECT_THAT(last.status().message(), Not(HasSubstr("not registered")));
}

}  // namespace
}  // namespace stash::testing

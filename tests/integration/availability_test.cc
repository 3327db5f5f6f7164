// Issue 20: no member of the socket's group can deny stashd to others, for a moment or for good.
// Floods of connections past the daemon's open-file limit, one user holding every daemon-wide
// budget while another user's first session is served, and sessions that never read their lease
// answers (docs/security.md, "Limits").
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/descriptor_socket.h"
#include "common/shm.h"
#include "common/unique_fd.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/harness.h"

namespace stash::testing {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr uid_t kNobody = 65534;

std::vector<std::string> Flags(const std::string& socket) {
  return {BinDir() + "/daemon/stashd", "--socket=" + socket,  "--pool-bytes=8MiB",
          "--page-bytes=64KiB",        "--host-tier-bytes=0", "--backend=host"};
}

// stashd on `<dir>/stashd.sock` with at most `nofile` open files (prlimit), or the test's own
// limit when 0.
class LimitedDaemon {
 public:
  explicit LimitedDaemon(int nofile, std::vector<std::string> extra = {})
      : socket_(dir_.path() + "/stashd.sock") {
    std::vector<std::string> argv;
    if (nofile > 0) {
      argv = {"/usr/bin/prlimit",
              "--nofile=" + std::to_string(nofile) + ":" + std::to_string(nofile), "--"};
    }
    for (std::string& a : Flags(socket_)) argv.push_back(std::move(a));
    for (std::string& a : extra) argv.push_back(std::move(a));
    started_ = process_.Start(argv, dir_.path() + "/stashd");
  }
  bool Ready() {
    const auto until = Clock::now() + std::chrono::seconds(10 * TimeScale());
    while (started_ && Clock::now() < until) {
      if (SocketAccepts(socket_)) return true;
      if (!process_.running()) return false;
      usleep(10000);
    }
    return false;
  }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_.path(); }
  Process& process() { return process_; }

 private:
  TempDir dir_;
  std::string socket_;
  Process process_;
  bool started_ = false;
};

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

// `n` plain connections that say nothing (a connect that fails ends the flood early).
std::vector<UniqueFd> Flood(const std::string& path, int type, int n) {
  std::vector<UniqueFd> held;
  for (int i = 0; i < n; ++i) {
    UniqueFd fd = ConnectUnix(path, type);
    if (!fd.valid()) break;
    held.push_back(std::move(fd));
  }
  return held;
}

// Runs `argv` as `uid` (the test's own user when it is the current one): its exit code.
int RunAs(uid_t uid, const std::vector<std::string>& argv, std::string* err = nullptr) {
  return RunCommand(argv, nullptr, err, {}, uid == geteuid() ? static_cast<uid_t>(-1) : uid);
}

// A client of `mode` (daemon-copy "once", mapped "once-mapped") stashes, reloads and checks
// 256 KiB as `uid`: 0 when it all worked.
int ClientRound(const std::string& socket, const std::string& mode, uid_t uid,
                std::string* err = nullptr) {
  return RunAs(uid, {BinDir() + "/tests/integration/stash-test-client", socket, mode, "262144"},
               err);
}

int StatsRound(const std::string& socket, uid_t uid, std::string* err = nullptr) {
  return RunAs(uid, {BinDir() + "/client/stashctl/stashctl", "--socket=" + socket, "stats"}, err);
}

// Retries `round` until it returns 0 or `limit` passed since `from`; true when it did return 0.
template <typename Round>
bool ServedWithin(Clock::time_point from, std::chrono::milliseconds limit, Round round,
                  std::string* last_err) {
  while (true) {
    if (round(last_err) == 0) return true;
    if (Clock::now() - from > limit) return false;
    usleep(20000);
  }
}

// CPU seconds (user + system) process `pid` has used so far, from /proc/<pid>/stat.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces) start at its closing parenthesis.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0;
  uint64_t stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Lets uid 65534's group onto the daemon's directory and both sockets, as the stashd group
// would be.
void LetNobodyIn(const std::string& dir, const std::string& socket) {
  ASSERT_EQ(chown(dir.c_str(), static_cast<uid_t>(-1), kNobody), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0750), 0);
  ASSERT_EQ(chown(socket.c_str(), static_cast<uid_t>(-1), kNobody), 0);
  ASSERT_EQ(chown((socket + ".fd").c_str(), static_cast<uid_t>(-1), kNobody), 0);
}

// One raw session on the gRPC socket, welcomed, saying Hello for this process.
struct RawSession {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream;
  v1::Welcome welcome;
  ~RawSession() { ctx.TryCancel(); }
};

std::unique_ptr<RawSession> OpenRaw(v1::StashService::Stub& stub, v1::Mode mode) {
  auto raw = std::make_unique<RawSession>();
  raw->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60 * TimeScale()));
  raw->stream = stub.Session(&raw->ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_mode(mode);
  v1::SessionResponse r;
  if (raw->stream->Write(hello) && raw->stream->Read(&r)) raw->welcome = r.welcome();
  return raw;
}

std::string LeasePacket(const v1::Welcome& w, uint64_t pages) {
  v1::DescriptorRequest request;
  request.set_session_id(w.session_id());
  request.set_session_secret(w.descriptor_secret());
  v1::TierPages* want = request.mutable_lease_chunks()->add_want();
  want->set_tier(v1::TIER_DEVICE);
  want->set_pages(pages);
  return request.SerializeAsString();
}

std::string DepositPacket(const v1::Welcome& w, uint64_t id, uint64_t bytes) {
  v1::DescriptorRequest request;
  request.set_session_id(w.session_id());
  request.set_session_secret(w.descriptor_secret());
  request.mutable_deposit_memory()->set_memory_id(id);
  request.mutable_deposit_memory()->set_bytes(bytes);
  return request.SerializeAsString();
}

// Sends `packet` on `c` and reads the answer's packets until the last one (its descriptors are
// closed): the last answer, code -1 when none came within `timeout_ms`; `*parts` counts the
// packets before it.
v1::DescriptorResponse Ask(int c, const std::string& packet, const std::vector<int>& with,
                           int timeout_ms, size_t* parts = nullptr) {
  v1::DescriptorResponse r;
  r.set_code(-1);
  if (!SendPacket(c, packet, with).ok()) return r;
  size_t n = 0;
  while (WaitReadable(c, timeout_ms).ok()) {
    auto p = ReceivePacket(c);
    if (!p.ok() || !r.ParseFromString(p->bytes)) {
      r.set_code(-1);
      break;
    }
    if (!r.more()) break;
    ++n;
    r.set_code(-1);
  }
  if (parts != nullptr) *parts = n;
  return r;
}

uint64_t Count(const std::string& text, const std::string& what) {
  uint64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// 1,100 connections to the gRPC socket and 300 to the descriptor socket of a daemon limited to
// 200 open files: the daemon keeps accepting (a spare descriptor, refusals that say why), logs
// the shortage a few times, not per connection, and once the flood ends a client of each mode
// and stashctl are served within a second, with no restart.
TEST(Availability, AFloodPastTheOpenFileLimitCostsNothingOnceItEnds) {
  LimitedDaemon daemon(200);
  ASSERT_READY(daemon);
  std::string err;
  ASSERT_EQ(ClientRound(daemon.socket(), "once", geteuid(), &err), 0) << err;
  {
    std::vector<UniqueFd> grpc = Flood(daemon.socket(), SOCK_STREAM, 1100);
    std::vector<UniqueFd> fds = Flood(daemon.socket() + ".fd", SOCK_SEQPACKET, 300);
    EXPECT_GE(grpc.size(), 1000u) << "the kernel's backlog should take the flood";
    // Let the daemon work through the flood (accept, refuse, run out) before it ends.
    usleep(500000);
    EXPECT_TRUE(daemon.process().running()) << daemon.process().Stderr();
  }
  const auto ended = Clock::now();
  const std::chrono::milliseconds second(1000 * TimeScale());
  EXPECT_TRUE(ServedWithin(
      ended, second, [&](std::string* e) { return StatsRound(daemon.socket(), geteuid(), e); },
      &err))
      << err;
  EXPECT_TRUE(ServedWithin(
      ended, second,
      [&](std::string* e) { return ClientRound(daemon.socket(), "once", geteuid(), e); }, &err))
      << err;
  EXPECT_TRUE(ServedWithin(
      ended, second,
      [&](std::string* e) { return ClientRound(daemon.socket(), "once-mapped", geteuid(), e); },
      &err))
      << err;
  // Out of descriptors is said once per 10 s per socket, never per connection.
  const std::string log = daemon.process().Stderr();
  EXPECT_LE(Count(log, "out of descriptors"), 4u) << log.substr(0, 4000);
  EXPECT_LE(Count(log, "refused"), 20u);
}

// One user (the test, root) takes all it can of every daemon-wide budget a flood reaches: gRPC
// connections, descriptor-channel connections, deposited descriptors, pool chunks. Another
// user's first sessions, one of each mode, and stashctl are served throughout, and the first
// user's refusals name the budget.
TEST(Availability, AnotherUsersFirstSessionIsServedWhileOneUserHoldsEveryBudget) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a second Unix user";
  LimitedDaemon daemon(1024);
  ASSERT_READY(daemon);
  LetNobodyIn(daemon.dir(), daemon.socket());
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials()));
  const int timeout_ms = 10000 * TimeScale();

  // Deposited descriptors: root's daemon-copy sessions deposit until refused (64 each, and a
  // quarter of the open-file limit in all, less another user's first session's 64).
  std::vector<std::unique_ptr<RawSession>> sessions;
  UniqueFd channel = ConnectUnix(daemon.socket() + ".fd", SOCK_SEQPACKET);
  auto memfd = CreateSealedMemfd("root", 1 << 16);
  ASSERT_TRUE(memfd.ok());
  v1::DescriptorResponse refused;
  uint64_t deposits = 0;
  for (int s = 0; s < 8 && refused.code() == 0; ++s) {
    sessions.push_back(OpenRaw(*stub, v1::MODE_DAEMON_COPY));
    for (uint64_t id = 1; id <= 64; ++id) {
      const v1::DescriptorResponse r =
          Ask(channel.get(), DepositPacket(sessions.back()->welcome, id, 1 << 16), {memfd->get()},
              timeout_ms);
      if (r.code() != 0) {
        refused = r;
        break;
      }
      ++deposits;
    }
  }
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(refused.message(), HasSubstr("descriptors deposited and not yet registered"));
  EXPECT_THAT(refused.message(), HasSubstr("another user's first session"));
  EXPECT_EQ(deposits, 1024u / 4 - 64);

  // Pool chunks: a mapped session of root leases what it may of the whole pool.
  sessions.push_back(OpenRaw(*stub, v1::MODE_MAPPED));
  size_t parts = 0;
  const v1::DescriptorResponse leased =
      Ask(channel.get(), LeasePacket(sessions.back()->welcome, 128), {}, timeout_ms, &parts);
  EXPECT_EQ(leased.code(), 0) << leased.message();
  EXPECT_EQ(parts, 1u + 30u);  // the control block and 32 chunks less the 2 kept
  channel.reset();

  // gRPC connections: root holds all it may, 96 of 128 with this open-file limit; the rest are
  // refused with the reason (up to 64 refusals held at once, each for 2 s; more are closed).
  std::vector<UniqueFd> grpc = Flood(daemon.socket(), SOCK_STREAM, 120);
  // Descriptor-channel connections: 64 per user.
  std::vector<UniqueFd> fds = Flood(daemon.socket() + ".fd", SOCK_SEQPACKET, 70);
  usleep(300000);  // accepted and counted

  // A fresh gRPC connection of this process (which holds another: `stub`'s) is refused, and
  // says which budget and why; stashctl as root, a process of its own, takes one of the places
  // kept for root and stashd's user.
  {
    // A connection of its own: gRPC would otherwise reuse the accepted one of `stub`.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto fresh = v1::StashService::NewStub(grpc::CreateCustomChannel(
        "unix:" + daemon.socket(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10 * TimeScale()));
    v1::GetStatsResponse r;
    const grpc::Status s = fresh->GetStats(&ctx, v1::GetStatsRequest(), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("gRPC connections"));
    EXPECT_THAT(s.error_message(), HasSubstr("uid 0"));
    EXPECT_THAT(s.error_message(), HasSubstr("go only to a process that holds no other"));
  }
  std::string err;
  EXPECT_EQ(StatsRound(daemon.socket(), geteuid(), &err), 0) << err;
  EXPECT_EQ(StatsRound(daemon.socket(), kNobody, &err), 0) << err;
  EXPECT_EQ(ClientRound(daemon.socket(), "once", kNobody, &err), 0) << err;
  EXPECT_EQ(ClientRound(daemon.socket(), "once-mapped", kNobody, &err), 0) << err;
  grpc.clear();
  fds.clear();
  sessions.clear();
}

// A session that asks for a lease and never reads the answer holds up nobody: 30 such sessions
// each ask for 100 one-page chunks on connections they never read, and a deposit and a lease of
// other sessions, on fresh connections, are answered within a second.
TEST(Availability, SessionsThatNeverReadLeaseAnswersHoldUpNobody) {
  LimitedDaemon daemon(0, {"--page-bytes=4KiB", "--chunk-bytes=4KiB", "--pool-bytes=16MiB",
                           "--max-lease-bytes=16MiB"});
  ASSERT_READY(daemon);
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<RawSession>> sessions;
  std::vector<UniqueFd> unread;
  for (int i = 0; i < 30; ++i) {
    sessions.push_back(OpenRaw(*stub, v1::MODE_MAPPED));
    ASSERT_FALSE(sessions.back()->welcome.session_id().empty());
    unread.push_back(ConnectUnix(daemon.socket() + ".fd", SOCK_SEQPACKET));
    ASSERT_TRUE(
        SendPacket(unread.back().get(), LeasePacket(sessions.back()->welcome, 100), {}).ok());
  }
  // A daemon-copy session deposits memory on a fresh connection.
  auto victim = OpenRaw(*stub, v1::MODE_DAEMON_COPY);
  auto memory = CreateSealedMemfd("victim", 1 << 20);
  ASSERT_TRUE(memory.ok());
  const int second = 1000 * TimeScale();
  UniqueFd c = ConnectUnix(daemon.socket() + ".fd", SOCK_SEQPACKET);
  auto start = Clock::now();
  const v1::DescriptorResponse deposited =
      Ask(c.get(), DepositPacket(victim->welcome, 7, 1 << 20), {memory->get()}, second);
  EXPECT_EQ(deposited.code(), 0) << deposited.message();
  EXPECT_LE(Clock::now() - start, std::chrono::milliseconds(second));
  // A mapped session's lease on a fresh connection is answered too, chunks and all.
  auto mapped = OpenRaw(*stub, v1::MODE_MAPPED);
  UniqueFd m = ConnectUnix(daemon.socket() + ".fd", SOCK_SEQPACKET);
  start = Clock::now();
  size_t parts = 0;
  const v1::DescriptorResponse leased =
      Ask(m.get(), LeasePacket(mapped->welcome, 4), {}, second, &parts);
  EXPECT_EQ(leased.code(), 0) << leased.message();
  EXPECT_EQ(parts, 5u);  // the control block and 4 chunks
  EXPECT_LE(Clock::now() - start, std::chrono::milliseconds(second));
  EXPECT_TRUE(daemon.process().running());
}

}  // namespace
// Issue 42: 1,000 idle raw connections to the gRPC socket (no HTTP/2 preface, ever) from one
// user take that user's whole share of gRPC connections. stashctl health as that user still
// answers SERVING at once, through the connections kept for root and stashd's user; after 10 s
// the daemon has closed every silent connection (their places free again), and that user's
// daemon-copy and mapped clients are served. The gate does not spin meanwhile.
TEST(Availability, IdleRawConnectionsCannotTakeHealthAwayFromTheirUser) {
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  if (nofile.rlim_max < 2048) GTEST_SKIP() << "the open-file hard limit is under 2048";
  nofile.rlim_cur = nofile.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &nofile), 0);
  LimitedDaemon daemon(4096);
  ASSERT_READY(daemon);
  const auto flooded = Clock::now();
  std::vector<UniqueFd> raw = Flood(daemon.socket(), SOCK_STREAM, 1000);
  ASSERT_EQ(raw.size(), 1000u);
  // Two that start the preface: one stops after a byte, one sends "PRI" and hangs up.
  ASSERT_EQ(send(raw.back().get(), "P", 1, MSG_NOSIGNAL), 1);
  {
    UniqueFd hung = ConnectUnix(daemon.socket(), SOCK_STREAM);
    ASSERT_TRUE(hung.valid());
    ASSERT_EQ(send(hung.get(), "PRI", 3, MSG_NOSIGNAL), 3);
  }
  usleep(300000);  // accepted: the user's share is full

  const std::string stashctl = BinDir() + "/client/stashctl/stashctl";
  std::string out;
  std::string err;
  const auto asked = Clock::now();
  EXPECT_EQ(RunCommand({stashctl, "--socket=" + daemon.socket(), "health"}, &out, &err), 0)
      << out << err;
  EXPECT_THAT(out, HasSubstr("SERVING"));
  EXPECT_LT(Clock::now() - asked, std::chrono::milliseconds(1000 * TimeScale()));
  EXPECT_EQ(RunCommand({stashctl, "--socket=" + daemon.socket(), "stats"}, &out, &err), 0) << err;
  // A session is not served on a kept connection: a trainer cannot hold one for its life.
  EXPECT_NE(ClientRound(daemon.socket(), "once", geteuid(), &err), 0);
  EXPECT_THAT(err, HasSubstr("serve no session"));

  // Every silent connection is closed by the daemon within 10 s of its accept (and a sweep).
  const double cpu_before = ProcessCpuSeconds(daemon.process().pid());
  const auto wait_from = Clock::now();
  size_t closed = 0;
  const auto until = flooded + std::chrono::seconds(10) + std::chrono::seconds(5 * TimeScale());
  while (closed < raw.size() && Clock::now() < until) {
    closed = 0;
    for (const UniqueFd& fd : raw) {
      char byte = 0;
      if (recv(fd.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK) == 0) ++closed;
    }
    usleep(200000);
  }
  EXPECT_EQ(closed, raw.size()) << "silent connections still open after the preface timeout";
  const double idle_seconds = std::chrono::duration<double>(Clock::now() - wait_from).count();
  const double cpu = ProcessCpuSeconds(daemon.process().pid()) - cpu_before;
  // Nothing spins: the daemon mostly sleeps while the silent connections wait.
  EXPECT_LT(cpu, 0.5 * idle_seconds)
      << "the daemon used " << cpu << " s of CPU in " << idle_seconds << " s";
  raw.clear();
  EXPECT_EQ(ClientRound(daemon.socket(), "once", geteuid(), &err), 0) << err;
  EXPECT_EQ(ClientRound(daemon.socket(), "once-mapped", geteuid(), &err), 0) << err;
  const std::string log = daemon.process().Stderr();
  EXPECT_THAT(log, HasSubstr("sent no HTTP/2 preface within 10000 ms"));
  EXPECT_LE(Count(log, "sent no HTTP/2 preface"), 4u) << "logged per connection, not per 10 s";
}

}  // namespace stash::testing

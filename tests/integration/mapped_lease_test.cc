// Mapped mode's leases against the real stashd (issue 13), spoken in raw descriptor packets: a
// forked holder process leases chunks, maps them, and returns them, closes its session, or is
// SIGKILLed; the daemon's stats say where every chunk is.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/descriptor_socket.h"
#include "common/unique_fd.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/raw_lease.h"

namespace stash::testing {
namespace {

namespace v1 = stash::v1;
using Clock = std::chrono::steady_clock;

// Pools of 128 pages of 64 KiB: chunks of 4 pages (the pool / 32), 32 per pool.
constexpr uint64_t kPageBytes = 64 << 10;
constexpr uint64_t kChunkBytes = 4 * kPageBytes;

std::vector<std::string> Flags() {
  return {"--pool-bytes=8MiB", "--page-bytes=64KiB", "--host-tier-bytes=0", "--backend=host"};
}

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

v1::TierStats Gpu0(const std::string& socket) {
  const v1::GetStatsResponse stats = DaemonStats(socket);
  return stats.tiers_size() > 0 ? stats.tiers(0) : v1::TierStats();
}

// A forked process that holds chunks: it waits for the session's id and secret, leases
// `pages` device pages, maps and writes every chunk, and reports how many it got; then it
// obeys one-byte commands: 'r' returns its chunks (reports the code), 'o' then a new session's
// id and secret returns them through that session as its first session's orphans (reports the
// code), 'q' exits. Syscalls and
// protobuf only: safe in a child of a gRPC process.
class Holder {
 public:
  explicit Holder(const std::string& fd_socket, uint64_t pages) {
    int to[2];
    int from[2];
    EXPECT_EQ(pipe2(to, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(from, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      close(to[1]);
      close(from[0]);
      _exit(Run(fd_socket, pages, to[0], from[1]));
    }
    close(to[0]);
    close(from[1]);
    to_.reset(to[1]);
    from_.reset(from[0]);
  }
  ~Holder() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Hands over the welcome; returns the chunks the holder leased (-1 on failure).
  int Start(const v1::Welcome& welcome) {
    const std::string msg = welcome.session_id() + welcome.descriptor_secret();
    if (write(to_.get(), msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) return -1;
    return Report();
  }
  // 'o': returns the chunks through the session of `welcome`, as orphans of the first session.
  int ReturnOrphansVia(const v1::Welcome& welcome) {
    const std::string msg = "o" + welcome.session_id() + welcome.descriptor_secret();
    if (write(to_.get(), msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) return -1;
    return Report();
  }
  int Command(char c) {
    if (write(to_.get(), &c, 1) != 1) return -1;
    return c == 'q' ? 0 : Report();
  }
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  void Reap() {
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

 private:
  int Report() {
    int value = -1;
    if (read(from_.get(), &value, sizeof(value)) != sizeof(value)) return -1;
    return value;
  }
  static int Run(const std::string& fd_socket, uint64_t pages, int in, int out) {
    auto report = [out](int v) { return write(out, &v, sizeof(v)) == sizeof(v); };
    char buf[64];
    size_t got = 0;
    while (got < sizeof(buf)) {
      const ssize_t n = read(in, buf + got, sizeof(buf) - got);
      if (n <= 0) return 1;
      got += static_cast<size_t>(n);
    }
    const std::string id(buf, 32);
    const std::string secret(buf + 32, 32);
    UniqueFd c = ConnectUnix(fd_socket);
    Lease lease = AskLease(c.get(), id, secret, pages);
    if (lease.last.code() != 0 || !lease.control_first) {
      report(-100 - lease.last.code());
      return 1;
    }
    for (const UniqueFd& fd : lease.chunks) {
      void* p = mmap(nullptr, kChunkBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED) return 1;
      std::memset(p, 0x42, kChunkBytes);  // kept mapped until exit
    }
    report(static_cast<int>(lease.ids.size()));
    while (true) {
      char cmd = 0;
      if (read(in, &cmd, 1) != 1 || cmd == 'q') return 0;
      if (cmd == 'r') report(AskReturn(c.get(), id, secret, lease.ids));
      if (cmd == 'o') {
        char next[64];
        size_t n = 0;
        while (n < sizeof(next)) {
          const ssize_t r = read(in, next + n, sizeof(next) - n);
          if (r <= 0) return 1;
          n += static_cast<size_t>(r);
        }
        report(
            AskReturn(c.get(), std::string(next, 32), std::string(next + 32, 32), lease.ids, id));
      }
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  UniqueFd to_;
  UniqueFd from_;
};

// Waits up to `limit` for `done` (checked every 2 ms); the time it took, or limit + 1 s.
template <typename F>
Clock::duration Await(Clock::duration limit, F done) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    if (done()) return Clock::now() - start;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return limit + std::chrono::seconds(1);
}

TEST(MappedLeases, WelcomeCarriesTheChunkGeometryAndModesAreKeptApart) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  RawSession mapped(daemon.socket(), getpid(), v1::MODE_MAPPED);
  ASSERT_FALSE(mapped.welcome().session_id().empty());
  EXPECT_EQ(mapped.welcome().chunk_bytes(), kChunkBytes);
  EXPECT_EQ(mapped.welcome().max_lease_bytes(), 8u << 20);
  EXPECT_FALSE(mapped.welcome().peer_tier());
  // A mapped session's stream carries no data path.
  v1::SessionRequest stash;
  stash.mutable_stash()->set_ticket(1);
  const v1::SessionResponse refused = mapped.Call(stash);
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_NE(refused.message().find("mapped mode"), std::string::npos) << refused.message();
  // Over the quota: RESOURCE_EXHAUSTED with the numbers, nothing granted.
  UniqueFd c = ConnectUnix(daemon.socket() + ".fd");
  const std::string& id = mapped.welcome().session_id();
  const std::string& secret = mapped.welcome().descriptor_secret();
  Lease over = AskLease(c.get(), id, secret, 1000);
  EXPECT_EQ(over.last.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_NE(over.last.message().find("8388608 bytes, of each tier (--max-lease-bytes)"),
            std::string::npos)
      << over.last.message();
  EXPECT_TRUE(over.chunks.empty());
  // Within it: chunks and the control block, then a lease entry.
  Lease ok = AskLease(c.get(), id, secret, 6);
  ASSERT_EQ(ok.last.code(), 0) << ok.last.message();
  EXPECT_TRUE(ok.control_first);
  EXPECT_EQ(ok.chunks.size(), 2u);
  ASSERT_GE(ok.last.lease_size(), 1);
  EXPECT_EQ(ok.last.lease(0).pages(), 8u);
  const v1::GetStatsResponse stats = DaemonStats(daemon.socket());
  bool found = false;
  for (const v1::SessionStats& s : stats.sessions()) {
    if (s.session_id() != id) continue;
    found = true;
    EXPECT_EQ(s.mode(), v1::MODE_MAPPED);
    ASSERT_EQ(s.leases_size(), 1);
    EXPECT_EQ(s.leases(0).chunks(), 2u);
    EXPECT_EQ(s.leases(0).pages_leased(), 8u);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(stats.tiers(0).chunks_leased(), 2u);
  EXPECT_EQ(stats.tiers(0).pages_used(), 8u);
  // A daemon-copy session leases nothing.
  RawSession copy(daemon.socket(), getpid(), v1::MODE_DAEMON_COPY);
  UniqueFd c2 = ConnectUnix(daemon.socket() + ".fd");
  Lease none =
      AskLease(c2.get(), copy.welcome().session_id(), copy.welcome().descriptor_secret(), 4);
  EXPECT_EQ(none.last.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  // Another session's chunk ids are not this one's to return.
  EXPECT_EQ(AskReturn(c.get(), id, secret, {ok.ids[0] + 100}),
            static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(AskReturn(c.get(), id, secret, ok.ids), 0);
  // Renewed: free again by the time the answer came.
  const auto limit = std::chrono::seconds(10 * TimeScale());
  EXPECT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_free() == 32; }), limit);
}

TEST(MappedLeases, ChunksComeBackAfterReturnChunks) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Holder holder(daemon.socket() + ".fd", 8);
  RawSession session(daemon.socket(), holder.pid(), v1::MODE_MAPPED);
  ASSERT_EQ(holder.Start(session.welcome()), 2);
  v1::TierStats t = Gpu0(daemon.socket());
  EXPECT_EQ(t.chunks_leased(), 2u);
  EXPECT_EQ(t.chunks_free(), 30u);
  EXPECT_EQ(holder.Command('r'), 0);
  t = Gpu0(daemon.socket());
  EXPECT_EQ(t.chunks_leased(), 0u);
  // Renewed and back in the ring.
  const auto limit = std::chrono::seconds(10 * TimeScale());
  EXPECT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_free() == 32; }), limit);
  EXPECT_EQ(Gpu0(daemon.socket()).pages_used(), 0u);
}

TEST(MappedLeases, ChunksStayOrphanedAfterTheStreamClosesUntilTheProcessExits) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Holder holder(daemon.socket() + ".fd", 8);
  auto session = std::make_unique<RawSession>(daemon.socket(), holder.pid(), v1::MODE_MAPPED);
  ASSERT_EQ(holder.Start(session->welcome()), 2);
  session.reset();  // the stream ends; the holder lives on and still maps its chunks
  const auto limit = std::chrono::seconds(10 * TimeScale());
  EXPECT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_orphaned() == 2; }), limit);
  v1::TierStats t = Gpu0(daemon.socket());
  EXPECT_EQ(t.chunks_leased(), 0u);
  EXPECT_EQ(t.chunks_free(), 30u);
  EXPECT_EQ(t.pages_used(), 8u);
  holder.Command('q');
  holder.Reap();
  EXPECT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_free() == 32; }), limit);
  t = Gpu0(daemon.socket());
  EXPECT_EQ(t.chunks_orphaned(), 0u);
  EXPECT_EQ(t.pages_used(), 0u);
}

// A rank whose stream ended while the daemon and the rank live (it reconnected): its new
// session returns the chunks the first one left orphaned, at once, not at the rank's exit.
TEST(MappedLeases, ALaterSessionOfTheSameProcessReturnsTheEndedSessionsOrphans) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Holder holder(daemon.socket() + ".fd", 8);
  auto first = std::make_unique<RawSession>(daemon.socket(), holder.pid(), v1::MODE_MAPPED);
  ASSERT_EQ(holder.Start(first->welcome()), 2);
  first.reset();  // the stream ends; the holder lives on
  const auto limit = std::chrono::seconds(10 * TimeScale());
  ASSERT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_orphaned() == 2; }), limit);
  RawSession second(daemon.socket(), holder.pid(), v1::MODE_MAPPED);
  ASSERT_FALSE(second.welcome().session_id().empty());
  EXPECT_EQ(holder.ReturnOrphansVia(second.welcome()), 0);
  EXPECT_EQ(Gpu0(daemon.socket()).chunks_orphaned(), 0u);  // the holder still lives
  // Renewed and free again.
  EXPECT_LT(Await(limit, [&] { return Gpu0(daemon.socket()).chunks_free() == 32; }), limit);
  EXPECT_EQ(Gpu0(daemon.socket()).pages_used(), 0u);
  holder.Command('q');
  holder.Reap();
}

TEST(MappedLeases, ChunksOfASigkilledHolderAreFreeWithinASecond) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  Holder holder(daemon.socket() + ".fd", 16);
  RawSession session(daemon.socket(), holder.pid(), v1::MODE_MAPPED);
  ASSERT_EQ(holder.Start(session.welcome()), 4);
  EXPECT_EQ(Gpu0(daemon.socket()).chunks_leased(), 4u);
  holder.Kill();
  const auto took = Await(std::chrono::seconds(10 * TimeScale()), [&] {
    const v1::TierStats t = Gpu0(daemon.socket());
    return t.chunks_free() == 32 && t.chunks_leased() == 0;
  });
  EXPECT_LE(took, std::chrono::seconds(1 * TimeScale()))
      << std::chrono::duration<double>(took).count() << " s";
}

// The kill test: a real mapped client (stash-test-client churn: steps of stashes,
// reloads, releases and automatic leases) SIGKILLed at 200 random points. After each kill every
// chunk of every tier is free again within 1 s, none leaked or orphaned, and the daemon's ring is
// whole (pages_used 0 with nothing else connected).
TEST(MappedLeases, ChunksOfAClientKilledAtRandomPointsAreAllFreeWithinASecond) {
  DaemonProcess daemon({"--pool-bytes=8MiB", "--page-bytes=64KiB", "--host-tier-bytes=4MiB",
                        "--backend=host", "--max-lease-bytes=4MiB"});
  ASSERT_READY(daemon);
  std::mt19937_64 random(std::random_device{}());
  const uint64_t seed = random();
  random.seed(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto all_free = [&] {
    v1::GetStatsResponse stats = DaemonStats(daemon.socket());
    for (const v1::TierStats& t : stats.tiers()) {
      if (t.chunks_free() != t.chunks_total() || t.pages_used() != 0) return false;
    }
    return stats.tiers_size() > 0;
  };
  std::chrono::steady_clock::duration slowest{};
  for (int kill = 0; kill < 200; ++kill) {
    Process client;
    ASSERT_TRUE(client.Start({BinDir() + "/tests/integration/stash-test-client", daemon.socket(),
                              "churn", std::to_string(1 << 20)},
                             daemon.dir() + "/churn"));
    // Up to 1 s for the session and its first lease, then a random point in its steps.
    const auto opened = Clock::now() + std::chrono::seconds(10 * TimeScale());
    while (client.Stdout().find("leased") == std::string::npos && Clock::now() < opened &&
           client.running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_NE(client.Stdout().find("leased"), std::string::npos) << client.Stderr();
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 20000));
    ASSERT_EQ(client.StopWith(SIGKILL, std::chrono::seconds(10)), 128 + SIGKILL)
        << "kill " << kill << ": " << client.Stderr();
    const auto took = Await(std::chrono::seconds(10 * TimeScale()), all_free);
    ASSERT_TRUE(all_free()) << "kill " << kill << ": chunks leaked";
    slowest = std::max(slowest, took);
  }
  EXPECT_LE(slowest, std::chrono::seconds(1 * TimeScale()))
      << std::chrono::duration<double>(slowest).count() << " s";
  const v1::GetStatsResponse stats = DaemonStats(daemon.socket());
  for (const v1::TierStats& t : stats.tiers()) {
    EXPECT_EQ(t.chunks_leased(), 0u) << t.name();
    EXPECT_EQ(t.chunks_orphaned(), 0u) << t.name();
  }
  EXPECT_TRUE(daemon.process().running());
}

}  // namespace
}  // namespace stash::testing

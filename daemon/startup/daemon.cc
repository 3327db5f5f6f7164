#include "daemon/startup/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "common/bytes.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/socket_path.h"
#include "common/socket_probe.h"
#include "common/sys.h"
#include "common/version.h"
#include "daemon/core/core.h"
#include "daemon/server/acceptor.h"
#include "daemon/server/connection_gate.h"
#include "daemon/server/descriptor_server.h"
#include "daemon/server/metrics.h"
#include "daemon/server/reflection_v1.h"
#include "daemon/server/service.h"
#include "daemon/startup/cuda_probe.h"
#include "daemon/startup/memory_fit.h"
#include "daemon/startup/systemd.h"

namespace stash::daemon {
namespace {

// The first bytes (at most 64 KiB) of a small file (the lock file's pool record).
std::string ReadFd(int fd) {
  std::string out(64 << 10, '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = 0;
    STASH_SYSCALL_RETRY(n, pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got)));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

namespace v1 = stash::v1;

std::string DirOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Creates the socket's directory when missing, and only that one: its parent must exist (a
// daemon started as root must not create directories anywhere a mistyped --socket points). A
// directory created here gets mode 0750 and the `stashd` group when that group exists: members
// may connect (search permission on the directory, write permission on the sockets) but not
// rename or replace the sockets.
Status PrepareSocketDir(const std::string& dir, gid_t group) {
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return FailedPreconditionError("socket directory " + dir + " exists but is not a directory");
    }
    return Status::Ok();
  }
  const std::string parent = DirOf(dir);
  if (stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("cannot create socket directory " + dir + ": its parent " +
                                   parent +
                                   " does not exist (stashd creates only the socket's own "
                                   "directory): create it first or pick another --socket");
  }
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ErrnoStatus("cannot create socket directory " + dir);
  }
  chmod(dir.c_str(), 0750);  // mkdir's mode is filtered by the umask
  if (group != static_cast<gid_t>(-1)) {
    if (chown(dir.c_str(), static_cast<uid_t>(-1), group) != 0) {
      Log("main")->warn("cannot give {} to group stashd: {}", dir, std::strerror(errno));
    }
  }
  return Status::Ok();
}

// Refuses a socket directory in which someone other than its owner may create, rename or remove
// files: they could put their own socket in the daemon's place and receive every client's
// memory and secrets. A sticky directory (/tmp) is fine: only a file's owner may remove it there.
Status CheckSocketDirIsPrivate(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return ErrnoStatus("cannot inspect socket directory " + dir);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FailedPreconditionError(
        "socket directory " + dir + " has mode " + mode +
        ": others may replace the daemon's sockets there. Make it writable by its owner only "
        "(chmod 0750 " +
        dir +
        "; systemd: RuntimeDirectoryMode=0750); group members connect "
        "with search permission alone");
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return FailedPreconditionError("socket directory " + dir + " belongs to uid " +
                                   std::to_string(st.st_uid) +
                                   ", who could replace the daemon's sockets: use a directory "
                                   "owned by the daemon's user or root");
  }
  return Status::Ok();
}

// Whether something accepts connections on the Unix socket at `path`.
bool SocketIsLive(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  close(fd);
  return rc == 0;
}

// gRPC connections the Unix socket serves at once: each costs a descriptor and gRPC's buffers.
// A user may hold at most 256, and beyond 32 only while 32 stay free for another user.
uint64_t MaxGrpcConnections() { return std::clamp<uint64_t>(OpenFileLimit() / 8, 64, 1024); }
constexpr uint64_t kGrpcConnectionsFirst = 32;
constexpr uint64_t kGrpcConnectionsPerUser = 256;
// Connections kept beyond every user's share for root and stashd's own user, so stashctl health,
// stats and drain answer while one of them holds its whole share (ConnectionGate).
constexpr uint64_t kReservedConnections = 8;
// The TCP listener (read-only statistics; its peers have no credentials): at most this many,
// each closed after a minute without a call.
constexpr uint64_t kTcpConnections = 64;
constexpr int kTcpIdleMs = 60 * 1000;
// Memory gRPC may use for its buffers, per server.
constexpr size_t kGrpcMemoryBytes = 1ULL << 30;

// A gRPC server that serves only connections handed to it (ConnectionGate), with the daemon's
// channel arguments.
// `idle_ms` (> 0) closes connections that carried no call for that long.
std::unique_ptr<grpc::Server> BuildServer(const std::vector<grpc::Service*>& services,
                                          int idle_ms = 0) {
  grpc::ServerBuilder builder;
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(16 << 20);
  // Streams per connection: a rank opens one session; stashctl one call at a time.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 64);
  if (idle_ms > 0) builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_ms);
  // gRPC's buffers over all connections: however many messages callers send, gRPC's memory stays
  // bounded (it sheds connections past this rather than growing the daemon).
  grpc::ResourceQuota quota("stashd");
  quota.Resize(kGrpcMemoryBytes);
  builder.SetResourceQuota(quota);
  return builder.BuildAndStart();
}

gid_t StashdGroup() {
  struct group* g = getgrnam("stashd");
  return g != nullptr ? g->gr_gid : static_cast<gid_t>(-1);
}

}  // namespace

struct Daemon::Impl {
  std::string socket_path;
  std::string lock_path;
  int lock_fd = -1;
  std::unique_ptr<DaemonCore> core;
  std::unique_ptr<DescriptorServer> descriptors;  // uses core: declared after it, gone before
  // The gates accept for the servers and the services look callers up in them: declared before
  // both, so they are destroyed after; their threads stop first (~Impl, Shutdown).
  std::unique_ptr<FairShare> connection_share;
  std::unique_ptr<FairShare> tcp_share;
  std::unique_ptr<ConnectionGate> gate;
  std::unique_ptr<ConnectionGate> tcp_gate;
  std::unique_ptr<StashServiceImpl> service;
  std::unique_ptr<StashServiceImpl> tcp_service;
  std::unique_ptr<ReflectionV1Service> reflection_v1;
  std::unique_ptr<ReflectionV1Service> tcp_reflection_v1;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::Server> tcp_server;
  std::unique_ptr<MetricsServer> metrics;  // reads core: gone before it
  Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;

  ~Impl() {
    // No gate hands a connection to a server that is going away.
    if (gate != nullptr) gate->Stop();
    if (tcp_gate != nullptr) tcp_gate->Stop();
    if (lock_fd >= 0) close(lock_fd);
  }
};

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Shutdown(); }

const std::string& Daemon::socket_path() const { return impl_->socket_path; }

void Daemon::Drain() { impl_->core->Drain(); }

uint64_t Daemon::SessionsLive() { return impl_->core->SessionsLive(); }

uint64_t Daemon::StashesLive() { return impl_->core->StashesLive(); }

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  auto log = Log("main");
  auto impl = std::make_unique<Impl>();

  // Backend.
  v1::Backend backend = v1::BACKEND_HOST;
  std::string why;
  const bool gpu = CudaDeviceAnswers(&why);
  switch (config.backend) {
    case BackendChoice::kHost:
      log->info("backend host (asked for; CUDA probe: {})", why);
      break;
    case BackendChoice::kCuda:
      if (!gpu) {
        return FailedPreconditionError("--backend=cuda but no CUDA device answers (" + why +
                                       "): run on a GPU node or use --backend=host");
      }
      backend = v1::BACKEND_CUDA;
      log->info("backend cuda (asked for; {})", why);
      break;
    case BackendChoice::kAuto:
      if (gpu) {
        backend = v1::BACKEND_CUDA;
        log->info("backend auto picked cuda: {}", why);
      } else {
        // On a GPU node this is a mistake worth seeing: the ranks' CUDA tensors cannot come here.
        log->warn(
            "backend auto picked host: no CUDA device answered ({}); on a GPU node check "
            "the driver and the devices this process sees, or pass --backend=cuda to "
            "refuse to start without one",
            why);
      }
      break;
  }

  // Socket: directory, single-daemon lock, stale file.
  impl->socket_path = DaemonSocketPath(config.socket);
  if (DescriptorSocketPath(impl->socket_path).size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgumentError(
        "socket path " + impl->socket_path + " is longer than " +
        std::to_string(sizeof(sockaddr_un::sun_path) - 1 - 3) +
        " bytes (the Unix socket limit, less the descriptor socket's \".fd\"): pick a shorter "
        "--socket");
  }
  const gid_t group = StashdGroup();
  if (group == static_cast<gid_t>(-1)) {
    log->warn(
        "there is no 'stashd' group: the sockets keep group {} (gid {}), so only that group's "
        "members and root can connect; create it (groupadd --system stashd), add the trainers' "
        "users (usermod -aG stashd USER) and restart stashd",
        GroupName(getegid()), getegid());
  }
  STASH_RETURN_IF_ERROR(PrepareSocketDir(DirOf(impl->socket_path), group));
  STASH_RETURN_IF_ERROR(CheckSocketDirIsPrivate(DirOf(impl->socket_path)));
  impl->lock_path = impl->socket_path + ".lock";
  // Owner-only and never through a symlink: nobody else may hold the lock or redirect the open.
  impl->lock_fd = open(impl->lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (impl->lock_fd < 0) return ErrnoStatus("cannot open lock file " + impl->lock_path);
  fchmod(impl->lock_fd, 0600);
  const std::string busy = "another stashd is already serving on " + impl->socket_path +
                           ": stop it first, or start this one with another --socket";
  if (flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) return FailedPreconditionError(busy);
  struct stat st {};
  if (lstat(impl->socket_path.c_str(), &st) == 0) {
    if (SocketIsLive(impl->socket_path)) return FailedPreconditionError(busy);
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError(impl->socket_path +
                                     " exists and is not a socket: remove it or pick another "
                                     "--socket");
    }
    log->info("replacing stale socket {} (no daemon behind it)", impl->socket_path);
    unlink(impl->socket_path.c_str());
  }

  // Tiers and queues, if the machine can hold them. A cuda stashd on this socket that did not
  // stop cleanly left its pools in the lock file: ranks may still map its chunks, whose memory
  // comes back as they unmap them, so it counts as this pool's.
  FreeMemory free = ReadFreeMemory(backend);
  const uint64_t pool_bytes = config.pool_bytes / config.page_bytes * config.page_bytes;
  if (backend == v1::BACKEND_CUDA) {
    const std::string record = ReadFd(impl->lock_fd);
    const std::vector<uint64_t> credited = CreditPreviousPools(record, pool_bytes, &free);
    for (size_t d = 0; d < credited.size(); ++d) {
      if (credited[d] == 0) continue;
      log->info(
          "gpu{} ({}): the previous stashd on {} did not stop cleanly; its pool ({}) counts as "
          "free, since its chunks come back as its ranks unmap them",
          d, free.gpu_uuids[d], impl->socket_path, FormatBytes(credited[d]));
    }
  }
  STASH_RETURN_IF_ERROR(CheckMemoryFits(config, backend, free));
  STASH_ASSIGN_OR_RETURN(impl->core, DaemonCore::Create(config, backend, impl->socket_path));
  if (backend == v1::BACKEND_CUDA) {
    const std::string record = PoolRecord(free.gpu_uuids, pool_bytes);
    if (ftruncate(impl->lock_fd, 0) != 0 || pwrite(impl->lock_fd, record.data(), record.size(),
                                                   0) != static_cast<ssize_t>(record.size())) {
      log->warn("cannot record the pools in {}: {}", impl->lock_path, std::strerror(errno));
    }
  }

  // The descriptor channel, before gRPC: a client that got its Welcome finds it there.
  STASH_ASSIGN_OR_RETURN(
      impl->descriptors,
      DescriptorServer::Start(
          DescriptorSocketPath(impl->socket_path), group,
          [core = impl->core.get()](const v1::DescriptorRequest& request,
                                    const PeerCredentials& peer, std::vector<UniqueFd>& fds) {
            return core->HandleDescriptors(request, peer, fds);
          }));

  // Every gRPC server gets health and v1alpha reflection.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  // The TCP listener and metrics first: once the Unix socket accepts, everything is up.
  int tcp_port = 0;
  if (!config.listen.empty()) {
    // Any local user reaches this port, past the socket's group: node-level numbers only,
    // unless the operator asked for the session rows too.
    int& port = tcp_port;
    auto tcp_listener = ListenTcp(config.listen, &port);
    if (!tcp_listener.ok()) {
      return UnavailableError("cannot listen on --listen=" + config.listen + ": " +
                              tcp_listener.status().message() +
                              " (the port is in use, another stashd?, or the address is not "
                              "local): pick a free port");
    }
    impl->tcp_share = std::make_unique<FairShare>(
        FairShare::Spec{"TCP listener connections", kTcpConnections, 0, 0,
                        "close connections to the --listen port that are not used"});
    STASH_ASSIGN_OR_RETURN(impl->tcp_gate, ConnectionGate::Create(std::move(tcp_listener).value(),
                                                                  "TCP listener " + config.listen,
                                                                  impl->tcp_share.get()));
    impl->tcp_service = std::make_unique<StashServiceImpl>(
        impl->core.get(), false, config.listen_sessions, impl->tcp_gate.get());
    impl->tcp_reflection_v1 = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
        "stash.v1.StashService", "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"});
    impl->tcp_server =
        BuildServer({impl->tcp_service.get(), impl->tcp_reflection_v1.get()}, kTcpIdleMs);
    if (impl->tcp_server == nullptr) {
      return UnavailableError("gRPC could not start the TCP listener's server (see the log above)");
    }
    impl->tcp_server->GetHealthCheckService()->SetServingStatus(true);
    impl->tcp_server->GetHealthCheckService()->SetServingStatus("stash.v1.StashService", true);
    log->info("serving read-only stats on tcp {} (port {}, {})", config.listen, port,
              config.listen_sessions ? "with per-session rows: --listen-sessions"
                                     : "node-level numbers only");
  }

  if (!config.metrics_listen.empty()) {
    auto metrics = MetricsServer::Start(config.metrics_listen, impl->core.get());
    if (!metrics.ok()) return metrics.status();
    impl->metrics = std::move(metrics).value();
    const std::string host = config.metrics_listen.substr(0, config.metrics_listen.rfind(':'));
    log->info("serving Prometheus metrics on http://{}:{}/metrics", host, impl->metrics->port());
  }

  // gRPC: the service, health and reflection, on connections the gate accepts (stashd accepts
  // every connection itself: ConnectionGate).
  impl->connection_share = std::make_unique<FairShare>(FairShare::Spec{
      "gRPC connections", MaxGrpcConnections(), kGrpcConnectionsFirst, kGrpcConnectionsPerUser,
      "close connections that are not used (one per process is enough)"});
  STASH_ASSIGN_OR_RETURN(UniqueFd listener, ListenUnix(impl->socket_path, SOCK_STREAM, group));
  ConnectionGate::Options gate_options;
  gate_options.reserved = kReservedConnections;
  gate_options.reserved_uid = geteuid();
  STASH_ASSIGN_OR_RETURN(impl->gate,
                         ConnectionGate::Create(std::move(listener), "gRPC socket",
                                                impl->connection_share.get(), gate_options));
  impl->service =
      std::make_unique<StashServiceImpl>(impl->core.get(), true, true, impl->gate.get());
  impl->reflection_v1 = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
      "stash.v1.StashService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
      "grpc.reflection.v1.ServerReflection"});
  impl->server = BuildServer({impl->service.get(), impl->reflection_v1.get()},
                             static_cast<int>(config.idle_connection_timeout_s) * 1000);
  if (impl->server == nullptr) {
    return UnavailableError("gRPC could not start its server (see the log above)");
  }
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  impl->server->GetHealthCheckService()->SetServingStatus("stash.v1.StashService", true);

  // Health follows draining: the overall status ("", readiness) is NOT_SERVING while the daemon
  // drains; "stash.v1.StashService" stays SERVING while it lives (liveness).
  grpc::Server* unix_server = impl->server.get();
  grpc::Server* tcp_server = impl->tcp_server.get();
  impl->core->SetDrainListener([unix_server, tcp_server](bool draining) {
    for (grpc::Server* server : {unix_server, tcp_server}) {
      if (server != nullptr) server->GetHealthCheckService()->SetServingStatus("", !draining);
    }
  });
  impl->core->SetListeners(
      impl->metrics != nullptr
          ? "http://" + config.metrics_listen.substr(0, config.metrics_listen.rfind(':')) + ":" +
                std::to_string(impl->metrics->port()) + "/metrics"
          : std::string(),
      tcp_port != 0
          ? config.listen.substr(0, config.listen.rfind(':')) + ":" + std::to_string(tcp_port)
          : std::string());
  // Everything is set up: serve. Connections that came meanwhile waited in the backlog.
  if (impl->tcp_gate != nullptr) impl->tcp_gate->Serve(impl->tcp_server.get());
  impl->gate->Serve(impl->server.get());
  log->info(
      "stashd {} serving on {} (backend {}, {} pool(s) of {}, page {}, host tier {})", kVersion,
      impl->socket_path, backend == v1::BACKEND_CUDA ? "cuda" : "host", impl->core->pools(),
      FormatBytes(config.pool_bytes / config.page_bytes * config.page_bytes),
      FormatBytes(config.page_bytes),
      config.host_tier_bytes == 0 ? std::string("none") : FormatBytes(config.host_tier_bytes));
  for (const DaemonConfig::Entry& e : config.entries) {
    log->info("config {} = {} ({})", e.name, e.value.empty() ? "\"\"" : e.value, e.source);
  }
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

void Daemon::Shutdown() {
  {
    MutexLock lock(&impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  auto log = Log("main");
  log->info("shutting down: ending sessions");
  impl_->server->GetHealthCheckService()->SetServingStatus(false);
  // Drain every pool before any stream ends: clients raise their pending done counters when
  // their stream ends, and a copy's done write landing after that could lower a counter (the
  // cuda executor's writes are plain stores) and hang a trainer's stream for ever. Requests
  // arriving meanwhile are answered UNAVAILABLE.
  impl_->core->Stop();
  impl_->gate->Stop();  // accepts no more; calls still find their callers until the servers end
  if (impl_->tcp_gate != nullptr) impl_->tcp_gate->Stop();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (impl_->tcp_server != nullptr) impl_->tcp_server->Shutdown(deadline);
  impl_->server->Shutdown(deadline);
  impl_->server->Wait();
  impl_->metrics.reset();
  impl_->descriptors.reset();
  unlink(impl_->socket_path.c_str());
  unlink(impl_->lock_path.c_str());
  log->info("stopped; removed {}", impl_->socket_path);
}

// Drains until every session ended or held nothing (no stash, no request in flight) for a whole
// second, `timeout` passed or another stop signal arrived. The second lets a rank finish what it
// does after its last reload (a stats call, a clean close) instead of seeing the daemon vanish
// under it; an idle session does not hold the stop up longer than that.
static void DrainFor(Daemon& daemon, std::chrono::seconds timeout, const sigset_t& stop) {
  if (timeout.count() == 0) return;
  daemon.Drain();
  auto log = Log("main");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Checked every 20 ms: the counters are spread over the sessions, and a stop need not be
  // faster than that.
  const struct timespec tick = {0, 20 * 1000 * 1000};
  auto idle_since = std::chrono::steady_clock::time_point::max();
  while (true) {
    const uint64_t sessions = daemon.SessionsLive();
    if (sessions == 0) {
      log->info("drained: every session ended");
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (daemon.StashesLive() != 0) {
      idle_since = std::chrono::steady_clock::time_point::max();
    } else if (idle_since == std::chrono::steady_clock::time_point::max()) {
      idle_since = now;
    } else if (now - idle_since >= std::chrono::seconds(1)) {
      log->info("drained: {} session(s) hold nothing", sessions);
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      log->warn(
          "drain timeout ({} s): stopping with {} session(s) holding {} stash(es) or "
          "request(s); their pages return and their ranks see UNAVAILABLE",
          timeout.count(), sessions, daemon.StashesLive());
      return;
    }
    if (sigtimedwait(&stop, nullptr, &tick) > 0) {
      log->warn(
          "second stop signal: stopping now with {} session(s) holding {} stash(es) or "
          "request(s)",
          sessions, daemon.StashesLive());
      return;
    }
  }
}

int RunDaemon(const DaemonConfig& config) {
  // Block the stop signals in every thread the daemon starts; this thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // The last grpc_shutdown (in ~Server, after Shutdown has ended every call) joins gRPC's executor
  // threads, and with gRPC 1.51 one of them can sit in a poll for up to 10 s: a stop then took
  // 10 s instead of milliseconds. The daemon holds a library reference for its whole life, so no
  // ~Server shuts the library down; the process exit ends those threads.
  grpc_init();

  auto daemon = Daemon::Start(config);
  if (!daemon.ok()) {
    LogStartFailure(daemon.status().message());
    return 1;
  }
  NotifyReady("serving on " + (*daemon)->socket_path());
  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  Log("main")->info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  NotifyStopping("draining, then stopping");
  DrainFor(**daemon, std::chrono::seconds(config.drain_timeout_s), stop);
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace stash::daemon

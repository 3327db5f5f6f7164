// The real stashd's lifecycle (docs/design.md): health and reflection, the control plane, one
// daemon per socket, stale sockets, stop signals, socket permissions, the read-only TCP
// listener, and the Session protocol's edge cases seen from a raw gRPC stream.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/stashctl/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/protos/reflection.grpc.pb.h"

namespace stash::testing {
namespace {

namespace v1 = stash::v1;
namespace health = grpc::health::v1;
namespace reflection = grpc::reflection::v1alpha;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// Small pools start fast; the host backend needs no GPU.
std::vector<std::string> Flags(std::vector<std::string> extra = {}, bool with_backend = true) {
  std::vector<std::string> flags = {"--pool-bytes=4MiB", "--page-bytes=64KiB",
                                    "--host-tier-bytes=0"};
  if (with_backend) flags.push_back("--backend=host");
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

std::string Stashd() { return BinDir() + "/daemon/stashd"; }

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10 * TimeScale());
}

// "Within 5 s" is a requirement; slow (sanitizer) builds scale it.
std::chrono::milliseconds StopLimit() { return std::chrono::seconds(5 * TimeScale()); }

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> TcpChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // a proxy in the environment must not interfere
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// Waits until `socket` accepts connections while `p` runs.
bool WaitServing(Process& p, const std::string& socket) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10 * TimeScale());
  while (std::chrono::steady_clock::now() < deadline) {
    if (!p.running()) return false;
    if (SocketAccepts(socket)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> LinesWith(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  for (const std::string& line : Lines(text)) {
    if (line.find(needle) != std::string::npos) out.push_back(line);
  }
  return out;
}

grpc::Status GetStats(const std::shared_ptr<grpc::Channel>& channel, v1::GetStatsResponse* out,
                      bool wait_for_ready = false) {
  auto stub = v1::StashService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  ctx.set_wait_for_ready(wait_for_ready);
  return stub->GetStats(&ctx, v1::GetStatsRequest(), out);
}

// A free TCP port on 127.0.0.1, found by binding port 0 and closing.
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

// ---- Health, reflection, control plane --------------------------------------------------------

TEST(Lifecycle, HealthIsServing) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  auto stub = health::Health::NewStub(UnixChannel(daemon.socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  health::HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, health::HealthCheckRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(response.status(), health::HealthCheckResponse::SERVING);
}

TEST(Lifecycle, ReflectionListsStashService) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  auto stub = reflection::ServerReflection::NewStub(UnixChannel(daemon.socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->ServerReflectionInfo(&ctx);

  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  reflection::ServerReflectionResponse listed;
  ASSERT_TRUE(stream->Read(&listed));
  ASSERT_TRUE(listed.has_list_services_response()) << listed.DebugString();
  EXPECT_EQ(listed.original_request().list_services(), "*");
  std::vector<std::string> names;
  for (const auto& service : listed.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_THAT(names, Contains("stash.v1.StashService"));

  // Any gRPC tool can also fetch the schema behind the name.
  reflection::ServerReflectionRequest file;
  file.set_file_containing_symbol("stash.v1.StashService");
  ASSERT_TRUE(stream->Write(file));
  reflection::ServerReflectionResponse described;
  ASSERT_TRUE(stream->Read(&described));
  ASSERT_TRUE(described.has_file_descriptor_response()) << described.DebugString();
  ASSERT_GT(described.file_descriptor_response().file_descriptor_proto_size(), 0);
  google::protobuf::FileDescriptorProto proto;
  ASSERT_TRUE(proto.ParseFromString(described.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(proto.package(), "stash.v1");
  bool has_service = false;
  for (const auto& service : proto.service()) has_service |= service.name() == "StashService";
  EXPECT_TRUE(has_service) << proto.name();

  ASSERT_TRUE(stream->WritesDone());
  const grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
}

// Asks a grpc.reflection.v1 stream for every service: their names, none when the stream failed.
template <typename Stream>
std::vector<std::string> ListServicesV1(Stream& stream) {
  grpc::reflection::v1::ServerReflectionRequest list;
  list.set_list_services("*");
  grpc::reflection::v1::ServerReflectionResponse listed;
  std::vector<std::string> names;
  if (!stream.Write(list) || !stream.Read(&listed)) return names;
  for (const auto& service : listed.list_services_response().service()) {
    names.push_back(service.name());
  }
  return names;
}

TEST(Lifecycle, ReflectionV1ListsStashServiceAndDescribesIt) {
  // grpcurl asks grpc.reflection.v1 first.
  namespace v1r = grpc::reflection::v1;
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  auto stub = v1r::ServerReflection::NewStub(UnixChannel(daemon.socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->ServerReflectionInfo(&ctx);

  const std::vector<std::string> names = ListServicesV1(*stream);
  EXPECT_THAT(names, Contains("stash.v1.StashService"));
  EXPECT_THAT(names, Contains("grpc.reflection.v1.ServerReflection"));

  v1r::ServerReflectionRequest file;
  file.set_file_containing_symbol("stash.v1.StashService.GetStats");
  ASSERT_TRUE(stream->Write(file));
  v1r::ServerReflectionResponse described;
  ASSERT_TRUE(stream->Read(&described));
  ASSERT_TRUE(described.has_file_descriptor_response()) << described.DebugString();
  google::protobuf::FileDescriptorProto proto;
  ASSERT_TRUE(proto.ParseFromString(described.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(proto.name(), "stash/v1/stash.proto");

  v1r::ServerReflectionRequest missing;
  missing.set_file_by_filename("no/such.proto");
  ASSERT_TRUE(stream->Write(missing));
  v1r::ServerReflectionResponse not_found;
  ASSERT_TRUE(stream->Read(&not_found));
  EXPECT_EQ(not_found.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ASSERT_TRUE(stream->WritesDone());
  const grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
}

// Issue 25: grpcurl asks v1 first on the read-only TCP listener too.
TEST(Lifecycle, ReflectionV1IsServedOnTheTcpListenerToo) {
  namespace v1r = grpc::reflection::v1;
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  DaemonProcess daemon(Flags({"--listen=127.0.0.1:" + std::to_string(port)}));
  ASSERT_READY(daemon);
  auto stub = v1r::ServerReflection::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->ServerReflectionInfo(&ctx);
  const std::vector<std::string> names = ListServicesV1(*stream);
  EXPECT_THAT(names, Contains("stash.v1.StashService"));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(Lifecycle, GetStatsAnswers) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  v1::GetStatsResponse stats;
  const grpc::Status s = GetStats(UnixChannel(daemon.socket()), &stats);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(stats.daemon().backend(), v1::BACKEND_HOST);
  EXPECT_FALSE(stats.daemon().version().empty());
  EXPECT_EQ(stats.daemon().sessions_live(), 0u);
  ASSERT_EQ(stats.tiers_size(), 1) << stats.DebugString();  // one pool, no host tier
  EXPECT_EQ(stats.tiers(0).name(), "gpu0");
  EXPECT_EQ(stats.tiers(0).page_bytes(), 64u << 10);
  EXPECT_EQ(stats.tiers(0).pages_total(), 64u);
  EXPECT_EQ(stats.tiers(0).pages_free(), 64u);
}

TEST(Lifecycle, GetConfigShowsTheSocketAndHostBackend) {
  DaemonProcess daemon(Flags({"--devices=2"}));
  ASSERT_READY(daemon);
  auto stub = v1::StashService::NewStub(UnixChannel(daemon.socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::GetConfigResponse config;
  const grpc::Status s = stub->GetConfig(&ctx, v1::GetConfigRequest(), &config);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(config.socket(), daemon.socket());
  EXPECT_EQ(config.backend(), v1::BACKEND_HOST);
  EXPECT_EQ(config.pools(), 2u);
  EXPECT_EQ(config.page_bytes(), 64u << 10);
  EXPECT_EQ(config.pool_pages(), 64u);
  EXPECT_EQ(config.host_tier_pages(), 0u);
  EXPECT_FALSE(config.version().empty());
  bool socket_entry = false;
  for (const auto& e : config.entries()) {
    if (e.name() != "socket") continue;
    socket_entry = true;
    EXPECT_EQ(e.value(), daemon.socket());
    EXPECT_EQ(e.source(), "flag");
  }
  EXPECT_TRUE(socket_entry) << config.DebugString();
}

// ---- One daemon per socket --------------------------------------------------------------------

TEST(Lifecycle, SecondDaemonOnSameSocketRefuses) {
  DaemonProcess first(Flags());
  ASSERT_READY(first);
  std::vector<std::string> argv = {Stashd(), "--socket=" + first.socket()};
  for (const std::string& f : Flags()) argv.push_back(f);
  std::string out;
  std::string err;
  const int code = RunCommand(argv, &out, &err);
  EXPECT_NE(code, 0);
  const auto lines = LinesWith(err, "already serving");
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr(first.socket()));
  EXPECT_THAT(lines[0], HasSubstr("--socket"));  // what to change
  // The first daemon is untouched.
  v1::GetStatsResponse stats;
  EXPECT_TRUE(GetStats(UnixChannel(first.socket()), &stats).ok());
  EXPECT_TRUE(first.process().running());
}

TEST(Lifecycle, StaleSocketFileIsReplaced) {
  TempDir dir;
  const std::string path = dir.path() + "/stashd.sock";
  {
    // A socket file with no listener: what a daemon killed without cleanup leaves behind.
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    close(fd);
  }
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  ASSERT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_FALSE(SocketAccepts(path));

  Process daemon;
  std::vector<std::string> argv = {Stashd(), "--socket=" + path};
  for (const std::string& f : Flags()) argv.push_back(f);
  ASSERT_TRUE(daemon.Start(argv, dir.path() + "/stashd"));
  ASSERT_TRUE(WaitServing(daemon, path)) << daemon.Stderr();
  v1::GetStatsResponse stats;
  const grpc::Status s = GetStats(UnixChannel(path), &stats);
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_THAT(daemon.Stderr(), HasSubstr("stale"));
  EXPECT_EQ(daemon.StopWith(SIGTERM, StopLimit()), 0);
}

TEST(Lifecycle, DaemonStartsAfterThePreviousOneWasKilled) {
  DaemonProcess killed(Flags());
  ASSERT_READY(killed);
  EXPECT_EQ(killed.process().StopWith(SIGKILL, StopLimit()), 128 + SIGKILL);
  ASSERT_TRUE(Exists(killed.socket()));  // left behind, with its lock file

  Process next;
  std::vector<std::string> argv = {Stashd(), "--socket=" + killed.socket()};
  for (const std::string& f : Flags()) argv.push_back(f);
  ASSERT_TRUE(next.Start(argv, killed.dir() + "/next"));
  ASSERT_TRUE(WaitServing(next, killed.socket())) << next.Stderr();
  v1::GetStatsResponse stats;
  EXPECT_TRUE(GetStats(UnixChannel(killed.socket()), &stats).ok());
  EXPECT_EQ(next.StopWith(SIGTERM, StopLimit()), 0);
}

// ---- Stop signals -----------------------------------------------------------------------------

void ExpectCleanStopOn(int sig) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  const int code = daemon.process().StopWith(sig, StopLimit());
  EXPECT_EQ(code, 0) << "-1 = still running after the limit; stderr: " << daemon.process().Stderr();
  EXPECT_FALSE(Exists(daemon.socket())) << "socket file left behind";
}

TEST(Lifecycle, SigtermStopsWithinFiveSecondsAndRemovesTheSocket) { ExpectCleanStopOn(SIGTERM); }

TEST(Lifecycle, SigintStopsWithinFiveSecondsAndRemovesTheSocket) { ExpectCleanStopOn(SIGINT); }

TEST(Lifecycle, SigtermWithAnOpenSessionStillStopsWithinFiveSeconds) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  auto stub = v1::StashService::NewStub(UnixChannel(daemon.socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
  ASSERT_TRUE(stream->Write(hello));
  v1::SessionResponse welcome;
  ASSERT_TRUE(stream->Read(&welcome));
  ASSERT_TRUE(welcome.has_welcome()) << welcome.DebugString();

  const int code = daemon.process().StopWith(SIGTERM, StopLimit());
  EXPECT_EQ(code, 0) << daemon.process().Stderr();
  EXPECT_FALSE(Exists(daemon.socket()));
  v1::SessionResponse more;
  // The drain told the session first (DaemonState, request_id 0); then the daemon ended it.
  int told = 0;
  while (stream->Read(&more)) {
    ASSERT_TRUE(more.has_daemon_state() && more.request_id() == 0) << more.DebugString();
    EXPECT_TRUE(more.daemon_state().draining());
    ++told;
  }
  EXPECT_EQ(told, 1);
  EXPECT_FALSE(stream->Finish().ok());
}

// ---- Backends ---------------------------------------------------------------------------------

TEST(Lifecycle, BackendAutoLogsThatItPickedHost) {
  DaemonProcess daemon(Flags({"--backend=auto"}, /*with_backend=*/false));
  ASSERT_READY(daemon);
  EXPECT_THAT(daemon.process().Stderr(), HasSubstr("picked host"));
  v1::GetStatsResponse stats;
  ASSERT_TRUE(GetStats(UnixChannel(daemon.socket()), &stats).ok());
  EXPECT_EQ(stats.daemon().backend(), v1::BACKEND_HOST);
}

TEST(Lifecycle, BackendCudaWithoutACudaBackendExitsWithAClearMessage) {
  TempDir dir;
  const std::string path = dir.path() + "/stashd.sock";
  std::vector<std::string> argv = {Stashd(), "--socket=" + path, "--backend=cuda"};
  for (const std::string& f : Flags({}, /*with_backend=*/false)) argv.push_back(f);
  std::string out;
  std::string err;
  const int code = RunCommand(argv, &out, &err);
  EXPECT_NE(code, 0) << err;
  const auto lines = LinesWith(err, "stashd: ");
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr("--backend=cuda"));
  EXPECT_THAT(lines[0], HasSubstr("--backend=host"));  // what to change
  EXPECT_FALSE(Exists(path));
}

// ---- Permissions ------------------------------------------------------------------------------

TEST(Lifecycle, SocketsAreMode0660AndADirectoryTheDaemonCreatesIs0750) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  ASSERT_EQ(mkdir(run.c_str(), 0755), 0);
  const std::string path = run + "/stashd/stashd.sock";
  Process daemon;
  std::vector<std::string> argv = {Stashd(), "--socket=" + path};
  for (const std::string& f : Flags()) argv.push_back(f);
  ASSERT_TRUE(daemon.Start(argv, dir.path() + "/stashd"));
  ASSERT_TRUE(WaitServing(daemon, path)) << daemon.Stderr();
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u) << std::oct << (st.st_mode & 07777);
  ASSERT_EQ(lstat((path + ".fd").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u) << std::oct << (st.st_mode & 07777);
  ASSERT_EQ(stat((path + ".lock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << std::oct << (st.st_mode & 07777);
  // Group members may connect but not replace the sockets.
  ASSERT_EQ(stat((run + "/stashd").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u) << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(daemon.StopWith(SIGTERM, StopLimit()), 0);
}

TEST(Lifecycle, ASocketDirectoryOthersCanWriteIsRefused) {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0770), 0);
  ASSERT_EQ(chmod(shared.c_str(), 0770), 0);
  std::string out, err;
  std::vector<std::string> argv = {Stashd(), "--socket=" + shared + "/stashd.sock"};
  for (const std::string& f : Flags()) argv.push_back(f);
  EXPECT_NE(RunCommand(argv, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("mode 0770"));
  EXPECT_THAT(err, HasSubstr("chmod 0750"));
  EXPECT_FALSE(Exists(shared + "/stashd.sock"));
  // Sticky, like /tmp: only a file's owner may remove it there.
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);
  Process daemon;
  ASSERT_TRUE(daemon.Start(argv, dir.path() + "/stashd"));
  EXPECT_TRUE(WaitServing(daemon, shared + "/stashd.sock")) << daemon.Stderr();
  EXPECT_EQ(daemon.StopWith(SIGTERM, StopLimit()), 0);
}

// A mistyped --socket (or one run as root) must not create directories anywhere: only the
// socket's own directory, under a parent that exists.
TEST(Lifecycle, SocketDirectoryIsCreatedOnlyUnderAParentThatExists) {
  TempDir dir;
  const std::string missing = dir.path() + "/a";
  std::vector<std::string> argv = {Stashd(), "--socket=" + missing + "/b/s.sock"};
  for (const std::string& f : Flags()) argv.push_back(f);
  std::string err;
  EXPECT_EQ(RunCommand(argv, nullptr, &err), 1) << err;
  const auto lines = LinesWith(err, "stashd: ");
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr("its parent " + missing + " does not exist"));
  EXPECT_FALSE(Exists(missing));
}

// ---- TCP --------------------------------------------------------------------------------------

// A second daemon asking for the first one's TCP port is refused (gRPC's default SO_REUSEPORT
// would let both listen and mix their stats).
TEST(Lifecycle, SecondDaemonOnTheSameTcpPortIsRefused) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string listen_flag = "--listen=127.0.0.1:" + std::to_string(port);
  DaemonProcess first(Flags({listen_flag}));
  ASSERT_READY(first);
  v1::GetStatsResponse stats;
  const grpc::Status s = GetStats(TcpChannel("127.0.0.1:" + std::to_string(port)), &stats, true);
  ASSERT_TRUE(s.ok()) << s.error_message();

  TempDir dir;
  std::vector<std::string> argv = {Stashd(), "--socket=" + dir.path() + "/stashd.sock"};
  for (const std::string& f : Flags({listen_flag})) argv.push_back(f);
  std::string err;
  EXPECT_EQ(RunCommand(argv, nullptr, &err), 1) << err;
  const auto lines = LinesWith(err, "stashd: ");
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr(listen_flag));
  EXPECT_THAT(lines[0], HasSubstr("in use"));
  EXPECT_TRUE(first.process().running());
}

// A session with a label, a rank and a pid, held open on the Unix socket.
struct OpenSession {
  explicit OpenSession(const std::string& socket)
      : stub(v1::StashService::NewStub(UnixChannel(socket))) {
    ctx.set_deadline(Deadline());
    stream = stub->Session(&ctx);
    v1::SessionRequest hello;
    hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
    hello.mutable_hello()->set_label("secret-job-label");
    hello.mutable_hello()->set_pid(424242);
    hello.mutable_hello()->set_rank(7);
    v1::SessionResponse welcome;
    ok = stream->Write(hello) && stream->Read(&welcome) && welcome.has_welcome();
    session_id = welcome.welcome().session_id();
  }
  ~OpenSession() {
    stream->WritesDone();
    stream->Finish();
  }
  std::unique_ptr<v1::StashService::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream;
  bool ok = false;
  std::string session_id;
};

// The TCP port is reachable by any local user, past the socket's group: it serves node-level
// numbers only (no pids, labels or session ids) unless the operator asks for more.
TEST(Lifecycle, TcpListenerServesOnlyNodeLevelNumbersUnlessAsked) {
  for (const bool asked : {false, true}) {
    SCOPED_TRACE(asked ? "--listen-sessions" : "default");
    const int port = FreeLoopbackPort();
    ASSERT_GT(port, 0);
    const std::string address = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> extra = {"--listen=" + address};
    if (asked) extra.push_back("--listen-sessions=true");
    DaemonProcess daemon(Flags(extra));
    ASSERT_READY(daemon);
    OpenSession session(daemon.socket());
    ASSERT_TRUE(session.ok);

    auto channel = TcpChannel(address);
    v1::GetStatsResponse stats;
    grpc::Status s = GetStats(channel, &stats, /*wait_for_ready=*/true);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(stats.daemon().sessions_live(), 1u);
    auto stub = v1::StashService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::ListSessionsResponse listed;
    s = stub->ListSessions(&ctx, v1::ListSessionsRequest(), &listed);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const std::string wire = stats.SerializeAsString() + listed.SerializeAsString();
    if (asked) {
      ASSERT_EQ(stats.sessions_size(), 1);
      EXPECT_EQ(stats.sessions(0).label(), "secret-job-label");
      EXPECT_EQ(listed.sessions_size(), 1);
      EXPECT_EQ(stats.sessions_omitted(), 0u);
    } else {
      EXPECT_EQ(stats.sessions_size(), 0);
      EXPECT_EQ(listed.sessions_size(), 0);
      EXPECT_EQ(stats.sessions_omitted(), 1u);
      EXPECT_EQ(listed.sessions_omitted(), 1u);
      EXPECT_EQ(wire.find("secret-job-label"), std::string::npos);
      EXPECT_EQ(wire.find(session.session_id), std::string::npos);
    }
    // The Unix socket always has the rows.
    ASSERT_TRUE(GetStats(UnixChannel(daemon.socket()), &stats).ok());
    ASSERT_EQ(stats.sessions_size(), 1);
    EXPECT_EQ(stats.sessions(0).pid(), 424242);
  }
}

TEST(Lifecycle, TcpListenerServesStatsAndRefusesSessions) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  DaemonProcess daemon(Flags({"--listen=" + address}));
  ASSERT_READY(daemon);
  auto channel = TcpChannel(address);

  v1::GetStatsResponse stats;
  // The TCP listener starts right after the Unix socket: wait for it.
  grpc::Status s = GetStats(channel, &stats, /*wait_for_ready=*/true);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message() << "\n"
                      << daemon.process().Stderr();
  EXPECT_EQ(stats.daemon().backend(), v1::BACKEND_HOST);

  auto stub = v1::StashService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_HOST);
  stream->Write(hello);  // may already fail: the daemon refuses at once
  v1::SessionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("Unix socket"));
}

TEST(Lifecycle, ListenOnABusyPortExitsWithAClearMessage) {
  // Hold a listening port for the whole test, so the daemon cannot have it.
  const int busy = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string listen_flag = "--listen=127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  TempDir dir;
  std::vector<std::string> argv = {Stashd(), "--socket=" + dir.path() + "/stashd.sock"};
  for (const std::string& f : Flags({listen_flag})) argv.push_back(f);
  std::string out;
  std::string err;
  const int code = RunCommand(argv, &out, &err);
  close(busy);
  EXPECT_NE(code, 0) << err;
  const auto lines = LinesWith(err, "stashd: ");
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr(listen_flag));
}

// ---- Session protocol edge cases --------------------------------------------------------------

v1::SessionRequest Hello(v1::Backend backend, int32_t device) {
  v1::SessionRequest r;
  r.mutable_hello()->set_backend(backend);
  r.mutable_hello()->set_device(device);
  r.mutable_hello()->set_rank(3);
  r.mutable_hello()->set_pid(getpid());
  r.mutable_hello()->set_client_version("lifecycle-test");
  return r;
}

// Sends `first` on a new Session stream and returns how the daemon ended the stream.
grpc::Status EndOfStreamAfter(const std::string& socket, const v1::SessionRequest& first) {
  auto stub = v1::StashService::NewStub(UnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->Session(&ctx);
  stream->Write(first);
  v1::SessionResponse response;
  while (stream->Read(&response)) {
    ADD_FAILURE() << "unexpected response: " << response.DebugString();
  }
  return stream->Finish();
}

TEST(SessionProtocol, FirstRequestNotHelloEndsTheStreamWithFailedPrecondition) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  v1::SessionRequest step;
  step.set_request_id(1);
  step.mutable_begin_step()->set_step(1);
  const grpc::Status s = EndOfStreamAfter(daemon.socket(), step);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("Hello"));
}

TEST(SessionProtocol, HelloWithTheWrongBackendFailsPrecondition) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  const grpc::Status s = EndOfStreamAfter(daemon.socket(), Hello(v1::BACKEND_CUDA, 0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("--backend=cuda"));
}

TEST(SessionProtocol, HelloWithDeviceOutOfRangeIsInvalidArgument) {
  DaemonProcess daemon(Flags({"--devices=2"}));
  ASSERT_READY(daemon);
  const grpc::Status s = EndOfStreamAfter(daemon.socket(), Hello(v1::BACKEND_HOST, 2));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("devices 0..1"));
}

TEST(SessionProtocol, BadRequestIsAnsweredAndTheStreamGoesOn) {
  DaemonProcess daemon(Flags({"--devices=2"}));
  ASSERT_READY(daemon);
  auto channel = UnixChannel(daemon.socket());
  auto stub = v1::StashService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->Session(&ctx);

  ASSERT_TRUE(stream->Write(Hello(v1::BACKEND_HOST, 1)));
  v1::SessionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.code(), 0) << response.message();
  ASSERT_TRUE(response.has_welcome()) << response.DebugString();
  const v1::Welcome& welcome = response.welcome();
  EXPECT_EQ(welcome.backend(), v1::BACKEND_HOST);
  EXPECT_EQ(welcome.session_id().size(), 32u);
  EXPECT_EQ(welcome.pool(), 1);
  EXPECT_EQ(welcome.page_bytes(), 64u << 10);
  EXPECT_EQ(welcome.pool_pages(), 64u);
  EXPECT_EQ(welcome.host_tier_pages(), 0u);

  // Reload of a ticket this session never stashed.
  v1::SessionRequest reload;
  reload.set_request_id(1);
  reload.mutable_reload()->set_ticket(0x1234);
  reload.mutable_reload()->mutable_destination()->set_memory_id(1);
  ASSERT_TRUE(stream->Write(reload));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 1u);
  EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND)) << response.message();
  EXPECT_THAT(response.message(), HasSubstr("not a live stash"));

  // A malformed stash.
  v1::SessionRequest stash;
  stash.set_request_id(2);
  stash.mutable_stash()->set_ticket(7);
  stash.mutable_stash()->set_max_rows(4);
  ASSERT_TRUE(stream->Write(stash));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 2u);
  EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(response.message(), HasSubstr("row_bytes"));

  // A second Hello.
  v1::SessionRequest again = Hello(v1::BACKEND_HOST, 0);
  again.set_request_id(3);
  ASSERT_TRUE(stream->Write(again));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 3u);
  EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));

  // The session still works.
  v1::SessionRequest step;
  step.set_request_id(4);
  step.mutable_begin_step()->set_step(1);
  ASSERT_TRUE(stream->Write(step));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 4u);
  EXPECT_EQ(response.code(), 0) << response.message();
  EXPECT_TRUE(response.has_begin_step()) << response.DebugString();

  v1::GetStatsResponse stats;
  ASSERT_TRUE(GetStats(channel, &stats).ok());
  EXPECT_EQ(stats.daemon().rejected(), 3u);
  EXPECT_EQ(stats.daemon().sessions_live(), 1u);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).rejected(), 3u);
  EXPECT_EQ(stats.sessions(0).rank(), 3);

  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
}

// ---- Malformed input --------------------------------------------------------------------------

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Sends `messages` (raw bytes, whatever they hold) on a new Session stream, reads until the
// daemon ends it, and returns how it ended; `answers` counts the responses read.
grpc::Status EndOfRawStream(const std::string& socket, const std::vector<std::string>& messages,
                            int* answers = nullptr) {
  auto channel = UnixChannel(socket);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  const grpc::internal::RpcMethod method("/stash.v1.StashService/Session",
                                         grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &ctx));
  for (const std::string& m : messages) {
    if (!stream->Write(Bytes(m))) break;
  }
  grpc::ByteBuffer response;
  int read = 0;
  while (stream->Read(&response)) ++read;
  if (answers != nullptr) *answers = read;
  return stream->Finish();
}

std::string HelloBytes(const std::string& label = "job") {
  v1::SessionRequest hello = Hello(v1::BACKEND_HOST, 0);
  hello.mutable_hello()->set_label(label);
  return hello.SerializeAsString();
}

// gRPC's generated handler ended such a stream with OK and no reason; the daemon now says what
// is wrong, and a session opened before the bad message ends (its pages return).
TEST(SessionProtocol, MalformedMessagesEndTheStreamWithInvalidArgumentAndAReason) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  const std::string hello = HelloBytes();
  std::string nested;
  for (int i = 0; i < 200; ++i) nested += '\x4b';  // start group, unknown field 9
  std::mt19937 rng(7);
  std::string random(64, '\0');
  for (char& c : random) c = static_cast<char>(rng() | 0x80);  // every byte a bad tag varint
  struct Case {
    const char* name;
    std::vector<std::string> messages;
    const char* says;
  };
  const Case cases[] = {
      {"truncated Hello", {hello.substr(0, hello.size() - 3)}, "truncated"},
      {"invalid UTF-8 in a label",
       {HelloBytes("job-\xff\xfe")},
       "stash.v1.Hello.label is not "
       "valid UTF-8"},
      {"random bytes", {random}, "not a valid stash.v1.SessionRequest"},
      {"a length past the end", {std::string("\x12\x64", 2) + "abc"}, "says 100 bytes"},
      {"deeply nested unknown groups", {nested}, "nested deeper than 100"},
      {"after a good Hello", {hello, std::string("\x3a\x7f", 2)}, "message 2 of this"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status s = EndOfRawStream(daemon.socket(), c.messages);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.says));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("job-")));
  }
  v1::GetStatsResponse stats;
  ASSERT_TRUE(GetStats(UnixChannel(daemon.socket()), &stats).ok());
  EXPECT_EQ(stats.daemon().sessions_live(), 0u);
  EXPECT_EQ(stats.daemon().sessions_total(), 1u);
}

// Names, labels and tags are bounded, and unknown enum values are named with the known ones.
TEST(SessionProtocol, OversizeLabelAndUnknownBackendAreRefusedWithTheRule) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  grpc::Status s = EndOfRawStream(daemon.socket(), {HelloBytes(std::string(5 << 20, 'l'))});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "Hello.label is 5242880 bytes, over the limit of 256 bytes: shorten it");
  v1::SessionRequest unknown = Hello(v1::BACKEND_HOST, 0);
  unknown.mutable_hello()->set_backend(static_cast<v1::Backend>(99));
  s = EndOfRawStream(daemon.socket(), {unknown.SerializeAsString()});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("backend 99 is not a known Backend: use BACKEND_HOST or BACKEND_CUDA"));
  // Everyone else's stats still answer.
  v1::GetStatsResponse stats;
  EXPECT_TRUE(GetStats(UnixChannel(daemon.socket()), &stats).ok());
}

TEST(SessionProtocol, UnaryCallsWithUnparsablePayloadsAreInvalidArgument) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  auto channel = UnixChannel(daemon.socket());
  for (const char* name : {"GetStats", "ListSessions", "GetConfig"}) {
    SCOPED_TRACE(name);
    const std::string path = std::string("/stash.v1.StashService/") + name;  // outlives method
    const grpc::internal::RpcMethod method(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::ByteBuffer response;
    const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), method, &ctx, Bytes(std::string("\x0a\x05", 2) + "ab"), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("truncated"));
  }
}

}  // namespace
}  // namespace stash::testing

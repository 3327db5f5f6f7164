#include "client/stashctl/stashctl.h"

#include <absl/flags/flag.h>
#include <absl/flags/marshalling.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <sstream>
#include <string_view>
#include <vector>

#include "client/stashctl/format.h"
#include "client/stashctl/health.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/macros.h"
#include "common/socket_path.h"
#include "common/socket_probe.h"
#include "common/text.h"
#include "common/version.h"
#include "stash/v1/stash.grpc.pb.h"

// The flags: abseil holds their types and defaults. Their names carry a `stashctl_` prefix because
// abseil flags are process-wide and the daemon library defines `socket` too: a test or tool that
// links both must still link. The command line spells them without the prefix (kFlags), and
// ParseCommandLine parses values into Options with abseil's parsers without setting the flags, so
// it keeps no state between calls (and abseil prints nothing).
ABSL_FLAG(std::string, stashctl_socket, "", "Unix socket of the daemon");
ABSL_FLAG(std::string, stashctl_target, "", "HOST:PORT of a read-only TCP listener");
ABSL_FLAG(bool, stashctl_json, false, "print JSON");
ABSL_FLAG(bool, stashctl_detail, false, "sessions: live stashes by tag");
ABSL_FLAG(double, stashctl_watch, 0, "refresh period, seconds");
ABSL_FLAG(int64_t, stashctl_count, 0, "frames to print with --watch");
ABSL_FLAG(double, stashctl_timeout, 2, "deadline per request, seconds");

namespace stash::stashctl {
namespace {

// A period or deadline: positive and at most a day (longer is a typo, and must fit the waits).
bool SecondsOk(double seconds) { return std::isfinite(seconds) && seconds > 0 && seconds <= 86400; }

// Parses `value` into `*dst` with abseil's parser for T; false on a bad value.
template <typename T>
bool Parse(std::string_view value, T* dst) {
  std::string error;
  return absl::ParseFlag(absl::string_view(value.data(), value.size()), dst, &error);
}

struct FlagSpec {
  const char* name;        // as typed, with underscores; the abseil flag is stashctl_<name>
  const char* value_name;  // how --help shows the value; nullptr for a switch
  const char* help;        // for --help
  const char* expect;      // what a valid value looks like, for the error line
  bool (*apply)(std::string_view value, Options* options);  // false on a bad value
};

const FlagSpec kFlags[] = {
    {"socket", "PATH",
     "Unix socket of the daemon. Default: $STASHD_SOCKET, else /run/stashd/stashd.sock, else "
     "$XDG_RUNTIME_DIR/stashd/stashd.sock (or /tmp/stashd-<uid>/stashd.sock) when that exists",
     "a socket path, e.g. --socket=/run/stashd/stashd.sock",
     [](std::string_view v, Options* o) { return !v.empty() && Parse(v, &o->socket); }},
    {"target", "HOST:PORT",
     "Reach a daemon's read-only TCP listener (stashd --listen) instead of the Unix socket",
     "HOST:PORT, e.g. --target=127.0.0.1:7070",
     [](std::string_view v, Options* o) {
       const auto colon = v.rfind(':');
       return colon != std::string_view::npos && colon + 1 < v.size() &&
              v.substr(0, 5) != "unix:" && Parse(v, &o->target);
     }},
    {"json", nullptr,
     "Print the reply as one JSON object for scripts (proto field names, every field present; "
     "64-bit counters are strings, as proto3 JSON has them)",
     "true or false", [](std::string_view v, Options* o) { return Parse(v, &o->json); }},
    {"detail", nullptr,
     "With sessions: also what each session holds now by layer, microbatch and name, and each "
     "group's chunks by tier and its members' pages (JSON always has them, as `live` and "
     "`groups`)",
     "true or false", [](std::string_view v, Options* o) { return Parse(v, &o->detail); }},
    {"watch", "SECONDS",
     "Refresh every SECONDS (fractions allowed) until Ctrl-C. A terminal is cleared between "
     "frames; a pipe gets frames separated by a blank line (with --json: one object per line)",
     "a number of seconds > 0, e.g. --watch=2",
     [](std::string_view v, Options* o) { return Parse(v, &o->watch_s) && SecondsOk(o->watch_s); }},
    {"count", "N", "With --watch: stop after N frames. Default: until Ctrl-C",
     "a whole number >= 1, e.g. --count=10",
     [](std::string_view v, Options* o) { return Parse(v, &o->count) && o->count >= 1; }},
    {"service", "NAME",
     "health: the gRPC health service to ask. Default: \"\" (the daemon as a whole: "
     "NOT_SERVING while it drains); stash.v1.StashService stays SERVING while the daemon lives",
     "a health service name, e.g. --service=stash.v1.StashService",
     [](std::string_view v, Options* o) {
       o->service = std::string(v);
       return true;
     }},
    {"timeout", "SECONDS", "How long to wait for the daemon's answer to each request. Default: 2",
     "a number of seconds > 0, e.g. --timeout=5",
     [](std::string_view v, Options* o) {
       return Parse(v, &o->timeout_s) && SecondsOk(o->timeout_s);
     }},
    {"format", "table|csv|csv,noheader|json",
     "How to print: aligned tables (default, fitted to $COLUMNS or the terminal's width), CSV "
     "rows for scripts and spreadsheets (stats: one row per tier; sessions: per session; "
     "config: per knob), or JSON (as --json)",
     "table, csv, csv,noheader or json, e.g. --format=csv",
     [](std::string_view v, Options* o) {
       o->csv = v == "csv" || v == "csv,noheader";
       o->csv_header = v != "csv,noheader";
       if (v == "json") o->json = true;
       return o->csv || v == "json" || v == "table";
     }},
    {"query", "FIELD,...",
     "With --format=csv: only these fields, in this order (proto field names, e.g. "
     "rank,pid,label,bytes_live; a wrong name lists the valid ones), as nvidia-smi --query-gpu",
     "comma-separated field names, e.g. --query=rank,pid,label,bytes_live",
     [](std::string_view v, Options* o) {
       o->query.clear();
       size_t start = 0;
       while (start <= v.size()) {
         const size_t comma = std::min(v.find(',', start), v.size());
         if (comma == start) return false;  // an empty name
         o->query.emplace_back(v.substr(start, comma - start));
         start = comma + 1;
       }
       return !o->query.empty();
     }},
    {"label", "GLOB", "stats, sessions: only sessions whose label matches (shell glob: 'llama-*')",
     "a label or a glob, e.g. --label='llama-*'",
     [](std::string_view v, Options* o) { return Parse(v, &o->selection.label); }},
    {"rank", "N", "stats, sessions: only the sessions of this rank", "a rank, e.g. --rank=3",
     [](std::string_view v, Options* o) {
       int64_t rank = 0;
       if (!Parse(v, &rank)) return false;
       o->selection.rank = rank;
       return true;
     }},
    {"pid", "N", "stats, sessions: only the sessions of this process", "a pid, e.g. --pid=4242",
     [](std::string_view v, Options* o) {
       int64_t pid = 0;
       if (!Parse(v, &pid) || pid <= 0) return false;
       o->selection.pid = pid;
       return true;
     }},
    {"sort", "KEY",
     "stats, sessions: order sessions by rank, pid or label, or by held bytes (held: largest "
     "first). Default: by rank, as the daemon sends them",
     "rank, pid, label or held, e.g. --sort=held",
     [](std::string_view v, Options* o) {
       o->selection.sort = std::string(v);
       return ValidSortKey(o->selection.sort);
     }},
};

struct CommandSpec {
  const char* name;
  Command command;
  const char* help;
};

const CommandSpec kCommands[] = {
    {"stats", Command::kStats,
     "daemon counters (requests, bytes, latency, copy rate), one row per tier with its usage "
     "bar, one row per session and per group"},
    {"sessions", Command::kSessions,
     "the connected sessions: rank, pid, pool, label, age, counters, live pages, step flags; "
     "then the groups their mapped sessions form: members, memory held and claimed, depot "
     "misses"},
    {"config", Command::kConfig,
     "the daemon's effective knobs (value, where it came from, help), backend, socket, pools"},
    {"health", Command::kHealth,
     "the gRPC health check: prints SERVING and exits 0, else prints the status and exits 1; "
     "NOT_SERVING while the daemon drains (readiness) unless --service=stash.v1.StashService "
     "(liveness)"},
    {"drain", Command::kDrain,
     "start draining without stopping (root or stashd's user only): new sessions and stashes "
     "are refused, ranks reload what they stashed, health turns NOT_SERVING (SIGTERM does the "
     "same, then stops); `stashctl stats` shows what is left"},
    {"undrain", Command::kUndrain,
     "end draining (root or stashd's user only): sessions and stashes are taken again, health "
     "turns SERVING"},
};

const FlagSpec* FindFlag(std::string_view name) {
  for (const FlagSpec& flag : kFlags) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

std::string SecondsText(double seconds) {
  std::ostringstream text;
  text << seconds << "s";
  return text.str();
}

Status BadValue(const FlagSpec& flag, std::string_view value) {
  return InvalidArgumentError("--" + Dashed(flag.name) + "=" + std::string(value) + ": expected " +
                              flag.expect);
}

// `text` as a JSON string: quotes, backslashes and control characters escaped, other bytes as
// they are (UTF-8 passes through).
std::string JsonQuote(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// ------------------------------------------------------------------------------------------------
// Talking to the daemon
// ------------------------------------------------------------------------------------------------

// One channel and its stubs. A channel that failed to connect backs off before it tries again,
// so --watch makes a fresh Connection after a failed frame and sees a restarted daemon at once.
class Connection {
 public:
  explicit Connection(const Options& options)
      : channel_(grpc::CreateChannel(
            options.target.empty() ? GrpcUnixTarget(options.socket) : options.target,
            grpc::InsecureChannelCredentials())),
        stash_(v1::StashService::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)),
        timeout_(std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::duration<double>(options.timeout_s))) {}

  grpc::Status GetStats(v1::GetStatsResponse* reply) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stash_->GetStats(&context, v1::GetStatsRequest(), reply);
  }
  grpc::Status Drain(bool undrain, v1::DrainResponse* reply) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::DrainRequest request;
    request.set_undrain(undrain);
    return stash_->Drain(&context, request, reply);
  }
  grpc::Status GetConfig(v1::GetConfigResponse* reply) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stash_->GetConfig(&context, v1::GetConfigRequest(), reply);
  }
  // The server as a whole (service "").
  grpc::Status CheckHealth(const std::string& service,
                           grpc::health::v1::HealthCheckResponse* reply) {
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    return health_->Check(&context, request, reply);
  }

 private:
  void SetDeadline(grpc::ClientContext* context) const {
    context->set_deadline(std::chrono::system_clock::now() + timeout_);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StashService::Stub> stash_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::chrono::milliseconds timeout_;
};

// The daemon's address as error lines and watch headers show it.
std::string Where(const Options& options) {
  return options.target.empty() ? options.socket : "tcp " + options.target;
}

std::string OneLine(std::string text) {
  for (char& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return text;
}

// The one line a failed request prints (without the trailing newline): what happened, and what
// to do about it.
std::string ErrorLine(const Options& options, const char* rpc, const grpc::Status& status) {
  const std::string where = Where(options);
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (options.target.empty()) {
        if (ProbeSocket(options.socket).code() == StatusCode::kPermissionDenied) {
          return "stashctl: " + PermissionDeniedMessage(options.socket);
        }
        return "stashctl: no stashd answers on " + where +
               ": start it with 'stashd --socket=" + options.socket +
               "' or point STASHD_SOCKET at a running one";
      }
      return "stashctl: no stashd answers on " + where +
             ": start it with 'stashd --listen=" + options.target + "' or check --target";
    case grpc::StatusCode::CANCELLED:
      // What a server that shuts down mid-call answers.
      return "stashctl: stashd on " + where + " went away during " + rpc + " (stopping?)";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "stashctl: stashd on " + where + " did not answer " + rpc + " within " +
             SecondsText(options.timeout_s) +
             ": it may be overloaded or stuck (see its log), or raise --timeout";
    default:
      return "stashctl: " + std::string(rpc) + " on " + where +
             " failed: " + OneLine(FromGrpcStatus(status).ToString());
  }
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a reply we just received cannot fail: every field type has a JSON form.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

// One reply, rendered; or the failed request's line.
struct Frame {
  bool ok = false;
  std::string text;  // the reply (ok) or the error line without newline (!ok)
  int exit_code = kExitOk;
};

Frame Fetch(Connection& connection, const Options& options, bool pretty_json) {
  Frame frame;
  auto finish = [&](const char* rpc, const grpc::Status& status,
                    const google::protobuf::Message& reply, std::string human) {
    if (!status.ok()) {
      frame.text = ErrorLine(options, rpc, status);
      frame.exit_code = kExitFailure;
      return;
    }
    frame.ok = true;
    frame.text = options.json ? ToJson(reply, pretty_json) : std::move(human);
  };
  const size_t width = options.width;
  switch (options.command) {
    case Command::kStats: {
      v1::GetStatsResponse reply;
      grpc::Status status = connection.GetStats(&reply);
      SelectSessions(options.selection, reply.mutable_sessions());
      SelectGroups(options.selection, reply.sessions(), reply.mutable_groups());
      finish("GetStats", status, reply,
             !status.ok()  ? ""
             : options.csv ? RenderCsv(reply.tiers(), options.query, options.csv_header)
                           : RenderStats(reply, width));
      break;
    }
    case Command::kSessions: {
      // GetStats, not ListSessions: the same session rows (the daemon builds one from the
      // other) and the groups with the tiers' page sizes, from one snapshot. The JSON leaves the
      // daemon lines out (`stats` has them) and keeps the tiers, whose page_bytes size the
      // groups' pages.
      v1::GetStatsResponse reply;
      grpc::Status status = connection.GetStats(&reply);
      SelectSessions(options.selection, reply.mutable_sessions());
      SelectGroups(options.selection, reply.sessions(), reply.mutable_groups());
      reply.clear_daemon();
      finish("GetStats", status, reply,
             !status.ok()  ? ""
             : options.csv ? RenderCsv(reply.sessions(), options.query, options.csv_header)
                           : RenderSessionsAndGroups(reply, options.detail, width));
      break;
    }
    case Command::kConfig: {
      v1::GetConfigResponse reply;
      grpc::Status status = connection.GetConfig(&reply);
      finish("GetConfig", status, reply,
             !status.ok()  ? ""
             : options.csv ? RenderCsv(reply.entries(), options.query, options.csv_header)
                           : RenderConfig(reply, width));
      break;
    }
    case Command::kDrain: {
      v1::DrainResponse reply;
      grpc::Status status = connection.Drain(false, &reply);
      finish("Drain", status, reply,
             "draining: stashd on " + Where(options) + " refuses new sessions and stashes; " +
                 std::to_string(reply.sessions_live()) + " session(s) hold " +
                 std::to_string(reply.stashes_live()) +
                 " stash(es) or request(s) in flight (see stashctl stats; stashctl undrain "
                 "ends it)\n");
      break;
    }
    case Command::kUndrain: {
      v1::DrainResponse reply;
      grpc::Status status = connection.Drain(true, &reply);
      finish("Drain", status, reply,
             "stashd on " + Where(options) + " takes sessions and stashes again; " +
                 std::to_string(reply.sessions_live()) + " session(s) connected\n");
      break;
    }
    case Command::kHealth: {
      grpc::health::v1::HealthCheckResponse reply;
      grpc::Status status = connection.CheckHealth(options.service, &reply);
      std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(reply.status());
      if (name.empty()) name = "UNKNOWN(" + std::to_string(reply.status()) + ")";
      finish("Health/Check", status, reply, name + "\n");
      if (frame.ok && reply.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
        frame.exit_code = kExitFailure;
      }
      break;
    }
  }
  return frame;
}

// ------------------------------------------------------------------------------------------------
// --watch: frames until --count or SIGINT
// ------------------------------------------------------------------------------------------------

// The write end of the pipe the SIGINT handler writes to; -1 when no watch loop runs.
std::atomic<int> g_sigint_fd{-1};

void OnSigint(int /*signal*/) {
  const int fd = g_sigint_fd.load();
  if (fd >= 0) {
    const char byte = 1;
    const ssize_t n = write(fd, &byte, 1);  // async-signal-safe; a full pipe already says stop
    (void)n;
  }
}

// Installs the SIGINT handler for its lifetime (self-pipe, so the wait between frames wakes at
// once) and restores the previous one afterwards.
class SigintStop {
 public:
  SigintStop() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      fds_[0] = fds_[1] = -1;  // no pipe: SIGINT keeps its default action and ends the process
      return;
    }
    // A shell starts background jobs with SIGINT ignored; they keep it so.
    if (sigaction(SIGINT, nullptr, &previous_) != 0 || previous_.sa_handler == SIG_IGN) return;
    g_sigint_fd.store(fds_[1]);
    struct sigaction action {};
    action.sa_handler = OnSigint;
    sigemptyset(&action.sa_mask);
    installed_ = sigaction(SIGINT, &action, nullptr) == 0;
  }
  ~SigintStop() {
    if (installed_) sigaction(SIGINT, &previous_, nullptr);
    g_sigint_fd.store(-1);
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  SigintStop(const SigintStop&) = delete;
  SigintStop& operator=(const SigintStop&) = delete;

  // Waits up to `seconds`; true when SIGINT arrived (before or during the wait).
  bool WaitFor(double seconds) {
    if (fds_[0] < 0) {
      // No pipe: sleep; SIGINT keeps its default action.
      struct timespec ts {};
      ts.tv_sec = static_cast<time_t>(seconds);
      ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      struct pollfd pfd {};
      pfd.fd = fds_[0];
      pfd.events = POLLIN;
      const int ready = poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (ready > 0) return true;
      if (ready == 0) return false;
      if (errno != EINTR) return false;  // cannot wait on the pipe: go on watching
    }
  }

  // Whether SIGINT arrived, without waiting.
  bool Requested() { return WaitFor(0); }

 private:
  int fds_[2] = {-1, -1};
  bool installed_ = false;
  struct sigaction previous_ {};
};

const char* CommandName(Command command) {
  for (const CommandSpec& spec : kCommands) {
    if (spec.command == command) return spec.name;
  }
  return "stats";
}

// "Every 2s: stashctl stats on /run/stashd/stashd.sock  2024-05-02 10:11:12"
std::string WatchHeader(const Options& options) {
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  struct tm local {};
  if (localtime_r(&now, &local) != nullptr) {
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &local);
  }
  return "Every " + SecondsText(options.watch_s) + ": stashctl " + CommandName(options.command) +
         " on " + Where(options) + "  " + when + "\n";
}

int Watch(const Options& options, std::ostream& out, std::ostream& err, bool out_is_tty) {
  SigintStop stop;
  auto connection = std::make_unique<Connection>(options);
  int exit_code = kExitOk;
  for (int64_t n = 0; options.count == 0 || n < options.count; ++n) {
    if (n > 0 ? stop.WaitFor(options.watch_s) : stop.Requested()) break;
    Frame frame = Fetch(*connection, options, /*pretty_json=*/false);
    exit_code = frame.exit_code;
    if (!frame.ok) {
      // A daemon that was never there is a mistake to report at once; one that stops answering
      // later may be restarting, so keep watching.
      if (n == 0) {
        err << frame.text << "\n";
        return kExitFailure;
      }
      connection = std::make_unique<Connection>(options);
      if (options.json) {
        err << frame.text << "\n";  // stdout stays one JSON object per line
        err.flush();
        continue;
      }
      frame.text += " (retrying every " + SecondsText(options.watch_s) + ")\n";
    }
    if (options.json) {
      out << frame.text;
    } else {
      if (out_is_tty) {
        out << "\033[H\033[2J";
      } else if (n > 0) {
        out << "\n";
      }
      out << WatchHeader(options) << "\n" << frame.text;
    }
    out.flush();
  }
  return exit_code;
}

}  // namespace

std::string UsageText() {
  std::ostringstream out;
  out << "stashctl: inspect a running stashd, the per-node activation stash daemon.\n\n"
         "Usage: stashctl COMMAND [flags]\n\n"
         "Commands:\n";
  for (const CommandSpec& command : kCommands) {
    // The name, then the help wrapped in a column of its own.
    std::string text = Wrap(command.help, 96, std::string(12, ' '));
    std::string name = command.name;
    text.replace(2, name.size(), name);
    out << text;
  }
  out << "\nFlags go before or after the command, as --name=value or --name value:\n";
  for (const FlagSpec& flag : kFlags) {
    out << "  --" << Dashed(flag.name);
    if (flag.value_name != nullptr) out << "=" << flag.value_name;
    out << "\n" << Wrap(std::string(flag.help) + ".", 96, "      ");
  }
  out << "  --version\n      Print the version (stashctl's and the daemon's) and exit; with "
         "--json as one\n      JSON object.\n"
         "  --help\n      Print this text and exit.\n\n"
         "Examples:\n"
         "  stashctl stats                              pools, tiers and sessions, once\n"
         "  stashctl --watch 2 stats                    the same, refreshed every 2 s\n"
         "  stashctl sessions --socket /tmp/s/s.sock    a daemon on another socket\n"
         "  STASHD_SOCKET=/tmp/s/s.sock stashctl config\n"
         "  stashctl config --json | jq '.entries[] | select(.name == \"pool_bytes\")'\n"
         "  stashctl --target 127.0.0.1:7070 stats      a daemon's read-only TCP listener\n"
         "  stashctl sessions --sort=held --label='llama-*'   who holds the most, one job\n"
         "  stashctl sessions --format=csv --query=rank,pid,label,bytes_live\n"
         "  stashctl health || echo 'stashd is down'\n\n"
         "Exit status: 0 done (health: SERVING); 1 no daemon answers, a request failed, or\n"
         "health is not SERVING (one line on stderr says which); 2 bad command line.\n";
  return out.str();
}

StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine result;
  Options& options = result.options;
  options.socket = absl::GetFlag(FLAGS_stashctl_socket);
  options.target = absl::GetFlag(FLAGS_stashctl_target);
  options.json = absl::GetFlag(FLAGS_stashctl_json);
  options.detail = absl::GetFlag(FLAGS_stashctl_detail);
  options.watch_s = absl::GetFlag(FLAGS_stashctl_watch);
  options.count = absl::GetFlag(FLAGS_stashctl_count);
  options.timeout_s = absl::GetFlag(FLAGS_stashctl_timeout);
  const CommandSpec* command = nullptr;
  bool version = false;  // --version: the rest of the line still says which daemon to ask
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull" || arg == "help") {
      result.action = CommandLine::Action::kHelp;
      return result;
    }
    if (arg == "--version") {
      version = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      if (arg.size() > 1 && arg[0] == '-') {
        return InvalidArgumentError("unknown flag '" + arg + "' (see stashctl --help)");
      }
      const CommandSpec* found = nullptr;
      for (const CommandSpec& spec : kCommands) {
        if (arg == spec.name) found = &spec;
      }
      if (found == nullptr) {
        return InvalidArgumentError(
            "unknown command '" + arg +
            "': expected stats, sessions, config, health, drain or undrain (see "
            "stashctl --help)");
      }
      if (command != nullptr) {
        return InvalidArgumentError("one command at a time: got '" + std::string(command->name) +
                                    "' and '" + arg + "'");
      }
      command = found;
      continue;
    }
    const auto eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    for (char& ch : name) {
      if (ch == '-') ch = '_';
    }
    const FlagSpec* flag = FindFlag(name);
    if (flag == nullptr) {
      return InvalidArgumentError("unknown flag '" + arg.substr(0, eq) + "' (see stashctl --help)");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (flag->value_name == nullptr) {
      value = "true";  // a switch
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return InvalidArgumentError("flag --" + Dashed(name) + " needs a value: " + flag->expect);
    }
    if (!flag->apply(value, &options)) return BadValue(*flag, value);
  }
  if (version) {
    result.action = CommandLine::Action::kVersion;
    if (options.target.empty()) options.socket = ClientSocketPath(options.socket);
    return result;
  }
  if (command == nullptr) {
    return InvalidArgumentError(
        "no command given: use stats, sessions, config, health, drain or undrain (see stashctl "
        "--help)");
  }
  options.command = command->command;
  if (!options.query.empty() && !options.csv) {
    return InvalidArgumentError("--query picks CSV fields: add --format=csv");
  }
  if (options.csv) {
    if (options.json) return InvalidArgumentError("--format=csv and --json: give one");
    const google::protobuf::Descriptor* rows = nullptr;
    if (options.command == Command::kStats) rows = v1::TierStats::descriptor();
    if (options.command == Command::kSessions) rows = v1::SessionStats::descriptor();
    if (options.command == Command::kConfig) rows = v1::ConfigEntry::descriptor();
    if (rows == nullptr) {
      return InvalidArgumentError(
          "--format=csv prints the rows of stats (tiers), sessions or "
          "config; " +
          std::string(command->name) + " has none");
    }
    STASH_ASSIGN_OR_RETURN(options.query, ResolveQuery(*rows, std::move(options.query)));
  }
  if (!options.selection.empty() && options.command != Command::kStats &&
      options.command != Command::kSessions) {
    return InvalidArgumentError(
        "--label, --rank, --pid and --sort choose sessions: use them with "
        "stats or sessions");
  }
  if (options.count > 0 && options.watch_s <= 0) {
    return InvalidArgumentError("--count counts --watch frames: add --watch=SECONDS");
  }
  if (!options.target.empty()) {
    if (!options.socket.empty()) {
      return InvalidArgumentError("--socket and --target name two daemons: give one");
    }
  } else {
    options.socket = ClientSocketPath(options.socket);
  }
  return result;
}

size_t TerminalWidth(bool out_is_tty) {
  if (const char* columns = std::getenv("COLUMNS"); columns != nullptr && *columns != '\0') {
    char* end = nullptr;
    const long n = std::strtol(columns, &end, 10);
    if (end != nullptr && *end == '\0' && n > 0) return static_cast<size_t>(n);
  }
  if (!out_is_tty) return 0;
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 0;
}

int Run(const Options& options, std::ostream& out, std::ostream& err, bool out_is_tty) {
  if (options.watch_s > 0) return Watch(options, out, err, out_is_tty);
  Connection connection(options);
  const Frame frame = Fetch(connection, options, /*pretty_json=*/true);
  if (!frame.ok) {
    err << frame.text << "\n";
    err.flush();
    return kExitFailure;
  }
  out << frame.text;
  out.flush();
  return frame.exit_code;
}

int RunStashctl(int argc, char** argv, std::ostream& out, std::ostream& err, bool out_is_tty) {
  StatusOr<CommandLine> parsed = ParseCommandLine(argc, argv);
  if (!parsed.ok()) {
    err << "stashctl: " << parsed.status().message() << "\n";
    err.flush();
    return kExitUsage;
  }
  switch (parsed->action) {
    case CommandLine::Action::kHelp:
      out << UsageText();
      out.flush();
      return kExitOk;
    case CommandLine::Action::kVersion: {
      // This tool's version, then the daemon's: they may differ after an upgrade. Exit 0 either
      // way: the version of stashctl was printed.
      Options options = parsed->options;
      options.timeout_s = std::min(options.timeout_s, 1.0);
      Connection connection(options);
      v1::GetConfigResponse reply;
      const grpc::Status status = connection.GetConfig(&reply);
      if (options.json) {
        // {"stashctl": "0.1.0", "stashd": "0.1.0" or null, "daemon": where, "error": why not},
        // written by hand: four flat fields need no message type.
        out << "{\n \"stashctl\": " << JsonQuote(kVersion) << ",\n \"stashd\": "
            << (status.ok() ? JsonQuote(reply.version()) : std::string("null"))
            << ",\n \"daemon\": " << JsonQuote(Where(options));
        if (!status.ok()) {
          out << ",\n \"error\": " << JsonQuote(ErrorLine(options, "GetConfig", status).substr(10));
        }
        out << "\n}\n";
        out.flush();
        return kExitOk;
      }
      out << "stashctl " << kVersion << "\n";
      if (status.ok()) {
        out << "stashd " << reply.version() << " (" << Where(options) << ")\n";
      } else {
        out << "stashd: unknown, " << ErrorLine(options, "GetConfig", status).substr(10) << "\n";
      }
      out.flush();
      return kExitOk;
    }
    case CommandLine::Action::kRun:
      break;
  }
  Options options = parsed->options;
  options.width = TerminalWidth(out_is_tty);
  return Run(options, out, err, out_is_tty);
}

}  // namespace stash::stashctl

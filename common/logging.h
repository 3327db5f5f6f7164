// Named spdlog loggers: "main", "rpc", "pool", "copy", "ipc", "client". Never log inside per-page
// loops: count instead.
#ifndef STASH_COMMON_LOGGING_H_
#define STASH_COMMON_LOGGING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "stash/status.h"

namespace stash {

// Parses "trace|debug|info|warn|error|critical|off" (case-insensitive).
StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view text);

// Sets the level of every stashd logger (existing and future) to `level`.
void SetLogLevel(spdlog::level::level_enum level);

// How log lines look. kText: "2026-12-03T09:12:01.123+00:00 info  [stashd.main] message".
// kJson: one object per line, {"time":...,"level":...,"logger":...,"message":...}, for log
// shippers. Both carry the local time with its UTC offset.
enum class LogFormat { kText, kJson };

// Parses "text|json".
StatusOr<LogFormat> ParseLogFormat(std::string_view text);

// Sets the format of every stashd logger (existing and future).
void SetLogFormat(LogFormat format);

// The named logger, created on first use (stderr, thread-safe).
std::shared_ptr<spdlog::logger> Log(const std::string& name);

// Structured fields of the lines this thread logs while the object lives. In JSON format each is
// a key of the line's object after "message" (numbers as JSON numbers), so a log shipper can
// filter on session, rank, pid, layer, microbatch or name without parsing the text; in text
// format lines are unchanged (their messages say the same in words). Scopes nest: an inner one
// adds to the outer ones. Not copyable; lives on the stack of the logging thread.
//
//   LogFields fields;
//   fields.Add("session", id).Add("rank", rank);
//   Log("events")->warn("overflow: ...");   // {..., "message":"overflow: ...","session":...}
class LogFields {
 public:
  LogFields();
  LogFields(const LogFields&) = delete;
  LogFields& operator=(const LogFields&) = delete;
  ~LogFields();

  LogFields& Add(std::string_view key, std::string_view value);
  LogFields& Add(std::string_view key, int64_t value);

 private:
  size_t depth_;  // the thread's field count when this scope began
};

// A start-up failure that ends the process, on stderr in the chosen format: text
// "stashd: <message>", or one JSON object {"time":...,"level":"critical","logger":"stashd.main",
// "message":...} so a log shipper that reads JSON sees why the daemon never started.
void LogStartFailure(std::string_view message);

}  // namespace stash

#endif  // STASH_COMMON_LOGGING_H_

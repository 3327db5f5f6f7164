// Named spdlog loggers: "main", "rpc", "pool", "copy", "ipc", "client". Never log inside per-page
// loops: count instead.
#ifndef STASH_COMMON_LOGGING_H_
#define STASH_COMMON_LOGGING_H_

#include <memory>
#include <string>
#include <string_view>

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

}  // namespace stash

#endif  // STASH_COMMON_LOGGING_H_

#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <mutex>

namespace stash {

StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "warning") lower = "warn";
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warn") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "critical") return spdlog::level::critical;
  if (lower == "off") return spdlog::level::off;
  return InvalidArgumentError("'" + std::string(text) +
                              "' is not a log level: use trace, debug, info, warn, error, "
                              "critical or off");
}

namespace {
std::mutex g_mu;
spdlog::level::level_enum g_level = spdlog::level::info;
}  // namespace

void SetLogLevel(spdlog::level::level_enum level) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_level = level;
  spdlog::apply_all([level](const std::shared_ptr<spdlog::logger>& l) { l->set_level(level); });
}

std::shared_ptr<spdlog::logger> Log(const std::string& name) {
  const std::string full = "stashd." + name;
  if (auto existing = spdlog::get(full)) return existing;
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(full)) return existing;
  auto logger = spdlog::stderr_color_mt(full);
  logger->set_level(g_level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%n] %v");
  return logger;
}

}  // namespace stash

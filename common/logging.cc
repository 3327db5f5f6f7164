#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
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
LogFormat g_format = LogFormat::kText;

// %* in the JSON pattern: the message with JSON string escapes.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    static const char kHex[] = "0123456789abcdef";
    for (const char ch : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto byte = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        dest.push_back('\\');
        dest.push_back(ch);
      } else if (byte < 0x20) {
        const char escaped[] = {'\\', 'u', '0', '0', kHex[byte >> 4], kHex[byte & 15]};
        dest.append(escaped, escaped + sizeof(escaped));
      } else {
        dest.push_back(ch);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

void ApplyFormat(spdlog::logger& logger, LogFormat format) {
  if (format == LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","logger":"%n","message":"%*"})");
    logger.set_formatter(std::move(formatter));
  } else {
    logger.set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%-5l%$ [%n] %v");
  }
}
}  // namespace

StatusOr<LogFormat> ParseLogFormat(std::string_view text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return InvalidArgumentError("'" + std::string(text) + "' is not a log format: use text or json");
}

void SetLogFormat(LogFormat format) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_format = format;
  spdlog::apply_all([format](const std::shared_ptr<spdlog::logger>& l) {
    if (l->name().rfind("stashd.", 0) == 0) ApplyFormat(*l, format);
  });
}

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
  ApplyFormat(*logger, g_format);
  return logger;
}

}  // namespace stash

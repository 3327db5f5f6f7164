#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <cstdio>
#include <ctime>
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

// The fields of the LogFields scopes open on this thread, outermost first.
struct Field {
  std::string key;
  std::string value;  // JSON number text, or the raw string
  bool number;
};
thread_local std::vector<Field> t_fields;

// Appends `text` with JSON string escapes (no quotes).
void AppendEscaped(std::string_view text, spdlog::memory_buf_t& dest) {
  static const char kHex[] = "0123456789abcdef";
  for (const char ch : text) {
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

// %* in the JSON pattern: the message with JSON string escapes.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    AppendEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

// %& in the JSON pattern: ,"key":value for each field of the logging thread's LogFields. The
// logger is synchronous, so the formatter runs on the thread that logs.
class JsonFields final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& /*msg*/, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    for (const Field& f : t_fields) {
      dest.push_back(',');
      dest.push_back('"');
      AppendEscaped(f.key, dest);
      dest.append(std::string_view("\":"));
      if (f.number) {
        dest.append(f.value.data(), f.value.data() + f.value.size());
      } else {
        dest.push_back('"');
        AppendEscaped(f.value, dest);
        dest.push_back('"');
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonFields>();
  }
};

void ApplyFormat(spdlog::logger& logger, LogFormat format) {
  if (format == LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonMessage>('*').add_flag<JsonFields>('&').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","logger":"%n","message":"%*"%&})");
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

LogFields::LogFields() : depth_(t_fields.size()) {}

LogFields::~LogFields() { t_fields.resize(depth_); }

LogFields& LogFields::Add(std::string_view key, std::string_view value) {
  t_fields.push_back({std::string(key), std::string(value), false});
  return *this;
}

LogFields& LogFields::Add(std::string_view key, int64_t value) {
  t_fields.push_back({std::string(key), std::to_string(value), true});
  return *this;
}

void LogStartFailure(std::string_view message) {
  LogFormat format;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    format = g_format;
  }
  if (format == LogFormat::kText) {
    std::fprintf(stderr, "stashd: %.*s\n", static_cast<int>(message.size()), message.data());
    return;
  }
  // The same shape as the JSON lines (a logger may not exist yet, and must not be needed).
  char when[40] = "";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local) != nullptr) {
    const size_t n = std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S.000%z", &local);
    // strftime's +0000 as spdlog's +00:00.
    if (n >= 5 && n + 1 < sizeof(when)) {
      when[n + 1] = '\0';
      when[n] = when[n - 1];
      when[n - 1] = when[n - 2];
      when[n - 2] = ':';
    }
  }
  spdlog::memory_buf_t line;
  line.append(std::string_view(R"({"time":")"));
  line.append(std::string_view(when));
  line.append(std::string_view(R"(","level":"critical","logger":"stashd.main","message":")"));
  AppendEscaped(message, line);
  line.append(std::string_view("\"}\n"));
  std::fwrite(line.data(), 1, line.size(), stderr);
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

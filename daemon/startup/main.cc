// stashd: parses flags and calls RunDaemon (everything else lives in the library).
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/logging.h"
#include "common/version.h"
#include "daemon/config/config.h"
#include "daemon/core/core.h"
#include "daemon/startup/daemon.h"
#include "daemon/startup/planned_config.h"
#include "stash/v1/stash.pb.h"

namespace {

// Whether the command line or the environment asks for JSON logs, read without the parser (for
// the error that says the parser refused the line: it must be JSON too).
bool JsonLogsAsked(int argc, char** argv) {
  bool json = false;
  if (const char* env = std::getenv("STASHD_LOG_FORMAT")) json = std::strcmp(env, "json") == 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    for (const std::string_view flag : {"--log-format", "--log_format", "-log-format"}) {
      if (arg.substr(0, flag.size()) != flag) continue;
      const std::string_view rest = arg.substr(flag.size());
      if (rest.empty() && i + 1 < argc) json = std::string_view(argv[i + 1]) == "json";
      if (!rest.empty() && rest[0] == '=') json = rest.substr(1) == "json";
    }
  }
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  namespace d = stash::daemon;
  auto parsed = d::ParseCommandLine(argc, argv);
  if (!parsed.ok()) {
    if (JsonLogsAsked(argc, argv)) stash::SetLogFormat(stash::LogFormat::kJson);
    stash::LogStartFailure(parsed.status().message());
    return 2;
  }
  switch (parsed->action) {
    case d::CommandLine::Action::kHelp:
      std::fputs(d::UsageText().c_str(), stdout);
      return 0;
    case d::CommandLine::Action::kVersion:
      std::printf("stashd %s\n", stash::kVersion);
      return 0;
    case d::CommandLine::Action::kPrintConfig: {
      for (const std::string& warning : parsed->warnings) {
        std::fprintf(stderr, "stashd: warning: %s\n", warning.c_str());
      }
      const stash::v1::GetConfigResponse config = d::PlannedConfig(parsed->config);
      std::string json;
      google::protobuf::util::JsonPrintOptions options;
      options.add_whitespace = true;
      options.preserve_proto_field_names = true;
      options.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(config, &json, options);
      std::fputs(json.c_str(), stdout);
      return 0;
    }
    case d::CommandLine::Action::kRun:
      break;
  }
  stash::SetLogLevel(*stash::ParseLogLevel(parsed->config.log_level));
  stash::SetLogFormat(*stash::ParseLogFormat(parsed->config.log_format));
  for (const std::string& warning : parsed->warnings) stash::Log("main")->warn("{}", warning);
  return d::RunDaemon(parsed->config);
}

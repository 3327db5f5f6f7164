// stashd: parses flags and calls RunDaemon (everything else lives in the library).
#include <google/protobuf/util/json_util.h>

#include <cstdio>

#include "common/logging.h"
#include "common/version.h"
#include "daemon/config.h"
#include "daemon/core.h"
#include "daemon/daemon.h"
#include "daemon/planned_config.h"
#include "stash/v1/stash.pb.h"

int main(int argc, char** argv) {
  namespace d = stash::daemon;
  auto parsed = d::ParseCommandLine(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "stashd: %s\n", parsed.status().message().c_str());
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

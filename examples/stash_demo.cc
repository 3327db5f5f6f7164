// stash-demo: parses flags and runs the demo (launcher.h); see --help.
#include <cstdio>

#include "examples/demo_flags.h"
#include "examples/launcher.h"

int main(int argc, char** argv) {
  namespace demo = stash::demo;
  const demo::ParsedCommandLine parsed = demo::ParseDemoCommandLine(argc, argv);
  switch (parsed.action) {
    case demo::ParsedCommandLine::Action::kHelp:
      std::fputs(demo::DemoUsage().c_str(), stdout);
      return 0;
    case demo::ParsedCommandLine::Action::kError:
      std::fprintf(stderr, "stash-demo: %s\n", parsed.error.c_str());
      return 2;
    case demo::ParsedCommandLine::Action::kRun:
      break;
  }
  return demo::RunDemo(parsed.flags);
}

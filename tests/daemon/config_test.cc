// stashd's knobs (daemon/config/config.cc) through the real binary: abseil flags are process-wide,
// so every parse gets its own process. `--print-config` shows what was parsed and where it came
// from; a bad command line must exit 2 with one line naming the knob, the value and what is
// allowed.
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "stash/v1/stash.pb.h"
#include "tests/integration/harness.h"

namespace stash::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The knob table as users see it. `flag_value` and `env_value` are valid and differ from each
// other and from the default, so the reported value shows which one won.
struct Knob {
  const char* name;  // as GetConfig reports it
  const char* flag;  // dashed
  const char* env;
  const char* default_value;
  const char* flag_value;
  const char* env_value;
};

const Knob kKnobs[] = {
    {"socket", "--socket", "STASHD_SOCKET", "", "/tmp/from-flag.sock", "/tmp/from-env.sock"},
    {"backend", "--backend", "STASHD_BACKEND", "auto", "host", "cuda"},
    {"pool_bytes", "--pool-bytes", "STASHD_POOL_BYTES", "1GiB", "64MiB", "512MiB"},
    {"page_bytes", "--page-bytes", "STASHD_PAGE_BYTES", "256KiB", "64KiB", "1MiB"},
    {"host_tier_bytes", "--host-tier-bytes", "STASHD_HOST_TIER_BYTES", "1GiB", "0", "2GiB"},
    {"devices", "--devices", "STASHD_DEVICES", "1", "4", "8"},
    {"log_level", "--log-level", "STASHD_LOG_LEVEL", "info", "debug", "warn"},
    {"log_format", "--log-format", "STASHD_LOG_FORMAT", "text", "json", "json"},
    {"listen", "--listen", "STASHD_LISTEN", "", "127.0.0.1:7070", "127.0.0.1:7071"},
    {"listen_sessions", "--listen-sessions", "STASHD_LISTEN_SESSIONS", "false", "true", "1"},
    {"copy_threads", "--copy-threads", "STASHD_COPY_THREADS", "2", "8", "4"},
    {"max_inflight", "--max-inflight", "STASHD_MAX_INFLIGHT", "4096", "128", "64"},
    {"drain_timeout", "--drain-timeout", "STASHD_DRAIN_TIMEOUT", "5", "0", "30"},
    {"idle_connection_timeout", "--idle-connection-timeout", "STASHD_IDLE_CONNECTION_TIMEOUT",
     "300", "60", "0"},
    {"metrics_listen", "--metrics-listen", "STASHD_METRICS_LISTEN", "", "127.0.0.1:9464",
     "127.0.0.1:9465"},
    {"chunk_bytes", "--chunk-bytes", "STASHD_CHUNK_BYTES", "0", "1MiB", "2MiB"},
    {"max_lease_bytes", "--max-lease-bytes", "STASHD_MAX_LEASE_BYTES", "0", "64MiB", "128MiB"},
    {"peer_tier", "--peer-tier", "STASHD_PEER_TIER", "false", "true", "1"},
    {"copy_peer_tier", "--copy-peer-tier", "STASHD_COPY_PEER_TIER", "true", "false", "0"},
    {"group_peer_tier", "--group-peer-tier", "STASHD_GROUP_PEER_TIER", "true", "false", "0"},
    {"lock_memory", "--lock-memory", "STASHD_LOCK_MEMORY", "false", "true", "1"},
    {"warm_memory", "--warm-memory", "STASHD_WARM_MEMORY", "true", "false", "0"},
    {"huge_pages", "--huge-pages", "STASHD_HUGE_PAGES", "auto", "off", "off"},
};

const char* const kSizeKnobs[] = {"pool_bytes", "page_bytes", "host_tier_bytes"};

const Knob& KnobNamed(const std::string& name) {
  for (const Knob& k : kKnobs) {
    if (name == k.name) return k;
  }
  std::abort();
}

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result Stashd(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {testing::BinDir() + "/daemon/stashd"};
  argv.insert(argv.end(), args.begin(), args.end());
  Result r;
  r.code = testing::RunCommand(argv, &r.out, &r.err, env);
  return r;
}

// Runs `stashd --print-config ARGS` and parses its JSON.
::testing::AssertionResult PrintConfig(const std::vector<std::string>& args,
                                       const std::vector<std::string>& env,
                                       stash::v1::GetConfigResponse* config) {
  std::vector<std::string> all = {"--print-config"};
  all.insert(all.end(), args.begin(), args.end());
  const Result r = Stashd(all, env);
  if (r.code != 0) {
    return ::testing::AssertionFailure() << "exit " << r.code << ", stderr: " << r.err;
  }
  const auto status = google::protobuf::util::JsonStringToMessage(r.out, config);
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "bad JSON (" << status.ToString() << "): " << r.out;
  }
  return ::testing::AssertionSuccess();
}

const stash::v1::ConfigEntry* Entry(const stash::v1::GetConfigResponse& config,
                                    const std::string& name) {
  for (const auto& e : config.entries()) {
    if (e.name() == name) return &e;
  }
  return nullptr;
}

// The entry of `name` has `value` and `source`.
::testing::AssertionResult HasEntry(const stash::v1::GetConfigResponse& config,
                                    const std::string& name, const std::string& value,
                                    const std::string& source) {
  const stash::v1::ConfigEntry* e = Entry(config, name);
  if (e == nullptr) return ::testing::AssertionFailure() << "no entry " << name;
  // The default socket ("") is shown resolved: the path a daemon would serve on.
  const std::string want = name == "socket" && value.empty() ? config.socket() : value;
  if (want.empty() && name == "socket") return ::testing::AssertionFailure() << "no socket";
  if (e->value() != want || e->source() != source) {
    return ::testing::AssertionFailure() << name << " = '" << e->value() << "' (" << e->source()
                                         << "), want '" << value << "' (" << source << ")";
  }
  return ::testing::AssertionSuccess();
}

// Exit code 2, nothing on stdout, exactly one line on stderr that contains every `want`.
::testing::AssertionResult IsUsageError(const Result& r, const std::vector<std::string>& want) {
  if (r.code != 2) {
    return ::testing::AssertionFailure() << "exit " << r.code << " (want 2), stderr: " << r.err;
  }
  if (!r.out.empty()) return ::testing::AssertionFailure() << "stdout not empty: " << r.out;
  if (r.err.empty() || r.err.back() != '\n' || std::count(r.err.begin(), r.err.end(), '\n') != 1) {
    return ::testing::AssertionFailure() << "stderr is not exactly one line: [" << r.err << "]";
  }
  for (const std::string& w : want) {
    if (r.err.find(w) == std::string::npos) {
      return ::testing::AssertionFailure() << "stderr lacks '" << w << "': " << r.err;
    }
  }
  return ::testing::AssertionSuccess();
}

class Config : public ::testing::Test {
 protected:
  // Hermetic: knobs set in the environment that runs the tests must not leak into stashd.
  void SetUp() override {
    for (const Knob& k : kKnobs) unsetenv(k.env);
  }
};

TEST_F(Config, DefaultsAreReportedWithSourceDefault) {
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig({}, {}, &config));
  ASSERT_EQ(config.entries_size(), static_cast<int>(std::size(kKnobs)));
  for (const Knob& k : kKnobs) {
    EXPECT_TRUE(HasEntry(config, k.name, k.default_value, "default"));
    ASSERT_NE(Entry(config, k.name), nullptr);
    EXPECT_FALSE(Entry(config, k.name)->help().empty()) << k.name;
  }
  EXPECT_FALSE(config.version().empty());
}

TEST_F(Config, PrintConfigShowsWhatTheDaemonWouldServeWithoutPlaceholders) {
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig({"--backend=host", "--devices=3", "--pool-bytes=64MiB",
                           "--page-bytes=64KiB", "--host-tier-bytes=1MiB"},
                          {"STASHD_SOCKET=/tmp/planned/s.sock"}, &config));
  EXPECT_EQ(config.socket(), "/tmp/planned/s.sock");
  EXPECT_TRUE(HasEntry(config, "socket", "/tmp/planned/s.sock", "env"));
  EXPECT_EQ(config.backend(), stash::v1::BACKEND_HOST);
  EXPECT_EQ(config.pools(), 3U);
  EXPECT_EQ(config.page_bytes(), 64U << 10);
  EXPECT_EQ(config.pool_pages(), 1024U);
  EXPECT_EQ(config.host_tier_pages(), 16U);

  // Without --socket or $STASHD_SOCKET the default is resolved, not left empty.
  stash::v1::GetConfigResponse defaults;
  ASSERT_TRUE(PrintConfig({"--backend=host"}, {}, &defaults));
  EXPECT_THAT(defaults.socket(), HasSubstr("stashd"));
  EXPECT_TRUE(HasEntry(defaults, "socket", defaults.socket(), "default"));
  EXPECT_NE(defaults.backend(), stash::v1::BACKEND_UNSPECIFIED);
  EXPECT_EQ(defaults.pools(), 1U);
}

TEST_F(Config, ASwitchWithoutAValueIsTrueAndTakesNotTheNextArgument) {
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig({"--peer-tier", "--backend=host"}, {}, &config));
  EXPECT_TRUE(HasEntry(config, "peer_tier", "true", "flag"));
  EXPECT_EQ(config.backend(), stash::v1::BACKEND_HOST);
}

TEST_F(Config, PoolsBeyondFreeMemoryRefuseToStartWithTheNumbers) {
  char dir[] = "/tmp/stash-config-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const Result r = Stashd({std::string("--socket=") + dir + "/s.sock", "--backend=host",
                           "--devices=64", "--pool-bytes=64TiB", "--log-level=error"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the tiers need 4 PiB of host memory (--pool-bytes=64 TiB x "
                               "--devices=64 + --host-tier-bytes=1 GiB) but only"));
  EXPECT_THAT(r.err, HasSubstr("MemAvailable"));
}

// A daemon that logs a warning (an unknown STASHD_ variable) and then refuses to start (its pools
// do not fit), so its whole log is on stderr when it exits.
Result LogOfARefusedStart(const std::string& format) {
  char dir[] = "/tmp/stash-config-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) return {};
  Result r = Stashd({std::string("--socket=") + dir + "/s.sock", "--backend=host", "--devices=64",
                     "--pool-bytes=64TiB", "--log-format=" + format},
                    {"STASHD_NO_SUCH_KNOB=\"quoted\""});
  std::filesystem::remove_all(dir);
  return r;
}

TEST_F(Config, JsonLogLinesAreObjectsWithTimeZone) {
  const Result r = LogOfARefusedStart("json");
  EXPECT_EQ(r.code, 1) << r.err;
  static const std::regex kLine(
      R"re(\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d","level":"warning",)re"
      R"re("logger":"stashd\.main","message":"STASHD_NO_SUCH_KNOB is set but is no stashd knob[^"]*"\}\n)re");
  EXPECT_TRUE(std::regex_search(r.err, kLine)) << r.err;
}

TEST_F(Config, TextLogLinesCarryTheTimeZone) {
  const Result r = LogOfARefusedStart("text");
  EXPECT_EQ(r.code, 1) << r.err;
  static const std::regex kLine(
      R"re((^|\n)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d warning \[stashd\.main\] )re"
      R"re(STASHD_NO_SUCH_KNOB is set)re");
  EXPECT_TRUE(std::regex_search(r.err, kLine)) << r.err;
}

TEST_F(Config, MisspelledEnvVarIsAWarningNamingTheKnobs) {
  const Result r = Stashd({"--print-config"}, {"STASHD_POOL_BYTE=64MiB", "STASHD_BIN_DIR=/x"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("warning: STASHD_POOL_BYTE is set but is no stashd knob"));
  EXPECT_THAT(r.err, HasSubstr("Did you mean STASHD_POOL_BYTES?"));
  EXPECT_THAT(r.err, HasSubstr("STASHD_HOST_TIER_BYTES"));  // the list of knobs
  // Variables of the other stashd tools are no mistake.
  EXPECT_EQ(r.err.find("STASHD_BIN_DIR"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(Config, EveryKnobIsReadFromItsDashedFlag) {
  for (const Knob& k : kKnobs) {
    SCOPED_TRACE(k.flag);
    stash::v1::GetConfigResponse config;
    ASSERT_TRUE(PrintConfig({std::string(k.flag) + "=" + k.flag_value}, {}, &config));
    EXPECT_TRUE(HasEntry(config, k.name, k.flag_value, "flag"));
    for (const Knob& other : kKnobs) {
      if (&other != &k) {
        EXPECT_TRUE(HasEntry(config, other.name, other.default_value, "default"));
      }
    }
  }
}

TEST_F(Config, EveryKnobIsReadFromItsEnvVar) {
  for (const Knob& k : kKnobs) {
    SCOPED_TRACE(k.env);
    stash::v1::GetConfigResponse config;
    ASSERT_TRUE(PrintConfig({}, {std::string(k.env) + "=" + k.env_value}, &config));
    EXPECT_TRUE(HasEntry(config, k.name, k.env_value, "env"));
    for (const Knob& other : kKnobs) {
      if (&other != &k) {
        EXPECT_TRUE(HasEntry(config, other.name, other.default_value, "default"));
      }
    }
  }
}

TEST_F(Config, AllKnobsAtOnceFromFlagsAndEnv) {
  std::vector<std::string> flags;
  std::vector<std::string> env;
  for (size_t i = 0; i < std::size(kKnobs); ++i) {
    const Knob& k = kKnobs[i];
    if (i % 2 == 0) {
      flags.push_back(std::string(k.flag) + "=" + k.flag_value);
    } else {
      env.push_back(std::string(k.env) + "=" + k.env_value);
    }
  }
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig(flags, env, &config));
  for (size_t i = 0; i < std::size(kKnobs); ++i) {
    const Knob& k = kKnobs[i];
    if (i % 2 == 0) {
      EXPECT_TRUE(HasEntry(config, k.name, k.flag_value, "flag"));
    } else {
      EXPECT_TRUE(HasEntry(config, k.name, k.env_value, "env"));
    }
  }
}

TEST_F(Config, FlagWinsOverEnv) {
  for (const Knob& k : kKnobs) {
    SCOPED_TRACE(k.flag);
    stash::v1::GetConfigResponse config;
    ASSERT_TRUE(PrintConfig({std::string(k.flag) + "=" + k.flag_value},
                            {std::string(k.env) + "=" + k.env_value}, &config));
    EXPECT_TRUE(HasEntry(config, k.name, k.flag_value, "flag"));
  }
}

TEST_F(Config, FlagOverridesAnInvalidEnvValue) {
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig({"--pool-bytes=64MiB", "--backend=host"},
                          {"STASHD_POOL_BYTES=12XB", "STASHD_BACKEND=gpu"}, &config));
  EXPECT_TRUE(HasEntry(config, "pool_bytes", "64MiB", "flag"));
  EXPECT_TRUE(HasEntry(config, "backend", "host", "flag"));
}

TEST_F(Config, UnderscoreFlagsAndSeparateValuesWork) {
  stash::v1::GetConfigResponse config;
  ASSERT_TRUE(PrintConfig({"--pool_bytes=64MiB", "--max-inflight", "128", "--log_level", "warn"},
                          {}, &config));
  EXPECT_TRUE(HasEntry(config, "pool_bytes", "64MiB", "flag"));
  EXPECT_TRUE(HasEntry(config, "max_inflight", "128", "flag"));
  EXPECT_TRUE(HasEntry(config, "log_level", "warn", "flag"));
}

TEST_F(Config, SizesTakeBinaryUnitsFractionsAndBareBytes) {
  for (const char* size : {"64GiB", "512MiB", "1.5GiB", "1073741824", "3MB", "2T"}) {
    SCOPED_TRACE(size);
    stash::v1::GetConfigResponse config;
    ASSERT_TRUE(PrintConfig({std::string("--pool-bytes=") + size}, {}, &config));
    EXPECT_TRUE(HasEntry(config, "pool_bytes", size, "flag"));
    ASSERT_TRUE(PrintConfig({}, {std::string("STASHD_HOST_TIER_BYTES=") + size}, &config));
    EXPECT_TRUE(HasEntry(config, "host_tier_bytes", size, "env"));
  }
  for (const char* page : {"4KiB", "0.5MiB", "65536", "1GiB"}) {
    SCOPED_TRACE(page);
    stash::v1::GetConfigResponse config;
    ASSERT_TRUE(PrintConfig({std::string("--page-bytes=") + page}, {}, &config));
    EXPECT_TRUE(HasEntry(config, "page_bytes", page, "flag"));
  }
}

// The value is echoed as given, so the cross-knob rule "the pool holds a page" shows the parsed
// magnitude: 1 GiB pages fit in a pool of 1.5GiB or 1073741824 bytes, not in 1073741823 bytes.
TEST_F(Config, SizesAreParsedToTheExactByte) {
  stash::v1::GetConfigResponse config;
  EXPECT_TRUE(PrintConfig({"--page-bytes=1GiB", "--pool-bytes=1.5GiB"}, {}, &config));
  EXPECT_TRUE(PrintConfig({"--page-bytes=1GiB", "--pool-bytes=1073741824"}, {}, &config));
  EXPECT_TRUE(PrintConfig({"--page-bytes=1GiB", "--pool-bytes=1.0GiB"}, {}, &config));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=1GiB", "--pool-bytes=1073741823"}),
                           {"--pool-bytes=1073741823", "page"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=1GiB", "--pool-bytes=1023MiB"}),
                           {"--pool-bytes=1023MiB", "page"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=1GiB", "--pool-bytes=1GB"}),
                           {"--pool-bytes=1GB", "page"}));
}

TEST_F(Config, BadSizeExitsTwoNamingKnobValueAndUnits) {
  for (const char* name : kSizeKnobs) {
    const Knob& k = KnobNamed(name);
    for (const char* bad : {"12XB", "-1", "", "1.5", "GiB", "99999999999999999999"}) {
      SCOPED_TRACE(std::string(k.name) + " '" + bad + "'");
      const std::string flag = std::string(k.flag) + "=" + bad;
      EXPECT_TRUE(IsUsageError(Stashd({flag}), {flag, "'" + std::string(bad) + "'", "KiB"}));
      const std::string env = std::string(k.env) + "=" + bad;
      EXPECT_TRUE(IsUsageError(Stashd({}, {env}), {env, "'" + std::string(bad) + "'", "KiB"}));
    }
  }
}

TEST_F(Config, UnknownBackendExitsTwoListingTheBackends) {
  EXPECT_TRUE(IsUsageError(Stashd({"--backend=gpu"}), {"--backend=gpu", "auto, host, cuda"}));
  EXPECT_TRUE(
      IsUsageError(Stashd({}, {"STASHD_BACKEND=gpu"}), {"STASHD_BACKEND=gpu", "auto, host, cuda"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--backend=HOST"}), {"--backend=HOST", "auto, host, cuda"}));
}

TEST_F(Config, PageSizeThatIsNotAPowerOfTwoExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=3000"}), {"--page-bytes=3000", "power of two"}));
  EXPECT_TRUE(IsUsageError(Stashd({}, {"STASHD_PAGE_BYTES=3000"}),
                           {"STASHD_PAGE_BYTES=3000", "power of two"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=96KiB"}), {"--page-bytes=96KiB", "power of two"}));
}

TEST_F(Config, PageSizeOutside4KiBTo1GiBExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=2KiB"}), {"--page-bytes=2KiB", "4KiB to 1GiB"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=2GiB", "--pool-bytes=4GiB"}),
                           {"--page-bytes=2GiB", "4KiB to 1GiB"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=0"}), {"--page-bytes=0", "power of two"}));
}

TEST_F(Config, PageBiggerThanThePoolExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--pool-bytes=1MiB", "--page-bytes=2MiB"}),
                           {"--pool-bytes=1MiB", "at least one page"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--page-bytes=2MiB"}, {"STASHD_POOL_BYTES=1MiB"}),
                           {"STASHD_POOL_BYTES=1MiB", "at least one page"}));
}

TEST_F(Config, HostTierSmallerThanAPageExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--host-tier-bytes=1KiB"}),
                           {"--host-tier-bytes=1KiB", "0 (no host tier)", "at least one page"}));
}

TEST_F(Config, DeviceCountOutside1To64ExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--devices=0"}), {"--devices=0", "between 1 and 64"}));
  EXPECT_TRUE(
      IsUsageError(Stashd({}, {"STASHD_DEVICES=0"}), {"STASHD_DEVICES=0", "between 1 and 64"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--devices=65"}), {"--devices=65", "between 1 and 64"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--devices=two"}), {"--devices=two", "number"}));
}

TEST_F(Config, OtherCountsOutOfRangeExitTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--copy-threads=0"}), {"--copy-threads=0", "between 1 and"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--max-inflight=0"}), {"--max-inflight=0", "between 1 and"}));
  EXPECT_TRUE(
      IsUsageError(Stashd({}, {"STASHD_MAX_INFLIGHT=-5"}), {"STASHD_MAX_INFLIGHT=-5", "number"}));
}

TEST_F(Config, BadLogLevelExitsTwoListingTheLevels) {
  EXPECT_TRUE(IsUsageError(Stashd({"--log-level=loud"}), {"--log-level=loud", "trace", "off"}));
  EXPECT_TRUE(IsUsageError(Stashd({}, {"STASHD_LOG_LEVEL=loud"}),
                           {"STASHD_LOG_LEVEL=loud", "trace", "off"}));
}

TEST_F(Config, BadListenAddressExitsTwo) {
  for (const char* bad : {"foo", "127.0.0.1:65536", "127.0.0.1:", "host:http"}) {
    SCOPED_TRACE(bad);
    const std::string flag = std::string("--listen=") + bad;
    EXPECT_TRUE(IsUsageError(Stashd({flag}), {flag, "HOST:PORT", "0 to 65535"}));
  }
  EXPECT_TRUE(IsUsageError(Stashd({}, {"STASHD_LISTEN=foo"}), {"STASHD_LISTEN=foo", "HOST:PORT"}));
}

TEST_F(Config, UnknownFlagExitsTwoPointingAtHelp) {
  EXPECT_TRUE(IsUsageError(Stashd({"--pool-size=1GiB"}), {"--pool-size", "stashd --help"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--nope"}), {"--nope", "stashd --help"}));
}

TEST_F(Config, PositionalArgumentExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"serve"}), {"'serve'", "--knob=value"}));
  EXPECT_TRUE(IsUsageError(Stashd({"--pool-bytes=64MiB", "extra"}), {"'extra'", "--knob=value"}));
}

TEST_F(Config, FlagWithoutValueExitsTwo) {
  EXPECT_TRUE(IsUsageError(Stashd({"--pool-bytes"}), {"--pool-bytes", "needs a value"}));
}

TEST_F(Config, HelpMentionsEveryKnobWithItsDefaultAndEnvVar) {
  const Result r = Stashd({"--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const Knob& k : kKnobs) {
    SCOPED_TRACE(k.flag);
    // One knob's block runs from "  --flag=" to the next knob's.
    const std::string head = std::string("\n  ") + k.flag + "=";
    const size_t begin = r.out.find(head);
    ASSERT_NE(begin, std::string::npos) << r.out;
    const size_t end = r.out.find("\n  --", begin + head.size());
    const std::string block = r.out.substr(begin, end - begin);
    const std::string def = *k.default_value == '\0' ? "(none)" : k.default_value;
    EXPECT_THAT(block, HasSubstr("default: " + def)) << block;
    EXPECT_THAT(block, HasSubstr(std::string("env: ") + k.env)) << block;
  }
  EXPECT_THAT(r.out, HasSubstr("--print-config"));
  EXPECT_THAT(r.out, HasSubstr("--version"));
}

TEST_F(Config, VersionPrintsTheVersion) {
  const Result r = Stashd({"--version"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("stashd "));
}

}  // namespace
}  // namespace stash::daemon

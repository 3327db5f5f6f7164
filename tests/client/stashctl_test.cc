// stashctl: the formatting and the command line in-process, then the built binary end to end
// against the built stashd binary, each test with its own daemon on a socket in a fresh temp dir.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/stashctl/format.h"
#include "client/stashctl/stashctl.h"
#include "stash/v1/stash.pb.h"

extern char** environ;

namespace stash::stashctl {
namespace {

// ------------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------------

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// argv for the library entry points: "stashctl" then `args`.
class Argv {
 public:
  explicit Argv(std::vector<std::string> args) : storage_(std::move(args)) {
    storage_.insert(storage_.begin(), "stashctl");
    for (std::string& arg : storage_) pointers_.push_back(arg.data());
    pointers_.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(storage_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> pointers_;
};

struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

Outcome RunInProcess(std::vector<std::string> args) {
  Argv argv(std::move(args));
  std::ostringstream out;
  std::ostringstream err;
  Outcome outcome;
  outcome.exit_code = RunStashctl(argv.argc(), argv.argv(), out, err);
  outcome.out = out.str();
  outcome.err = err.str();
  return outcome;
}

// Sets an environment variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

// ------------------------------------------------------------------------------------------------
// Formatting
// ------------------------------------------------------------------------------------------------

TEST(StashctlFormat, UsageBarIsEmptyAtZero) {
  EXPECT_EQ(UsageBar(0, 256), "[....................]   0%");
}

TEST(StashctlFormat, UsageBarIsHalfFullAtFifty) {
  EXPECT_EQ(UsageBar(128, 256), "[##########..........]  50%");
}

TEST(StashctlFormat, UsageBarIsFullAtHundred) {
  EXPECT_EQ(UsageBar(256, 256), "[####################] 100%");
}

TEST(StashctlFormat, UsageBarRoundsDownSoOnlyAFullTierLooksFull) {
  EXPECT_EQ(UsageBar(999, 1000), "[###################.]  99%");
  EXPECT_EQ(UsageBar(35, 100), "[#######.............]  35%");
}

TEST(StashctlFormat, UsageBarShowsAnyUseAtAll) {
  EXPECT_EQ(UsageBar(1, 4096), "[#...................]  <1%");
}

TEST(StashctlFormat, UsageBarOfAnEmptyTierSaysNoPercentage) {
  EXPECT_EQ(UsageBar(0, 0), "[....................]   -%");
}

TEST(StashctlFormat, UsageBarHonoursItsWidth) {
  EXPECT_EQ(UsageBar(5, 10, 10), "[#####.....]  50%");
}

TEST(StashctlFormat, DurationsShowTheTwoLargestUnits) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(59.9), "59s");
  EXPECT_EQ(FormatDuration(303), "5m 03s");
  EXPECT_EQ(FormatDuration(2 * 3600 + 7 * 60 + 5), "2h 07m");
  EXPECT_EQ(FormatDuration(3 * 86400 + 4 * 3600), "3d 04h");
}

TEST(StashctlFormat, LatenciesAndRatesCarryTheirUnitsAndDashWhenUnmeasured) {
  EXPECT_EQ(FormatLatencyUs(3.25, true), "3.2 us");
  EXPECT_EQ(FormatLatencyUs(41.4, true), "41 us");
  EXPECT_EQ(FormatLatencyUs(503439, true), "503.4 ms");
  EXPECT_EQ(FormatLatencyUs(41.4, false), "-");
  // GB/s (1e9 bytes a second), the unit of the JSON's stash_copy_gbps: the two agree.
  EXPECT_EQ(FormatGbps(12.44), "12.4 GB/s");
  EXPECT_EQ(FormatGbps(1.073741824), "1.07 GB/s");
  EXPECT_EQ(FormatGbps(0.524288), "524.3 MB/s");
  EXPECT_EQ(FormatGbps(0), "-");
}

TEST(StashctlFormat, TableAlignsNamesLeftAndNumbersRight) {
  Table table({{"NAME", Table::Align::kLeft}, {"COUNT", Table::Align::kRight}});
  table.AddRow({"gpu0", "7"});
  table.AddRow({"host", "12345"});
  EXPECT_EQ(table.Render(),
            "NAME  COUNT\n"
            "gpu0      7\n"
            "host  12345\n");
}

TEST(StashctlFormat, TableLinesNeverEndInSpaces) {
  Table table({{"RANK", Table::Align::kRight}, {"LABEL", Table::Align::kLeft}});
  table.AddRow({"0", "a-long-label"});
  table.AddRow({"1", "x"});
  for (const std::string& line : Lines(table.Render())) {
    ASSERT_FALSE(line.empty());
    EXPECT_NE(line.back(), ' ') << "'" << line << "'";
  }
}

TEST(StashctlFormat, TableShowsControlCharactersAsQuestionMarks) {
  Table table({{"LABEL", Table::Align::kLeft}});
  table.AddRow({"\033[2Jjob\n"});
  EXPECT_EQ(table.Render(), "LABEL\n?[2Jjob?\n");
}

TEST(StashctlFormat, TableCountsOneCellPerUtf8CodePoint) {
  EXPECT_EQ(DisplayWidth("h\xC3\xA9llo"), 5u);  // "héllo"
  Table table({{"L", Table::Align::kLeft}, {"N", Table::Align::kRight}});
  table.AddRow({"h\xC3\xA9", "1"});
  table.AddRow({"abc", "2"});
  EXPECT_EQ(table.Render(),
            "L    N\n"
            "h\xC3\xA9   1\n"
            "abc  2\n");
}

TEST(StashctlFormat, TableFillsMissingCellsWithBlanks) {
  Table table({{"A", Table::Align::kLeft}, {"B", Table::Align::kRight}});
  table.AddRow({"x"});
  EXPECT_EQ(table.Render(), "A  B\nx\n");
}

v1::GetStatsResponse SampleStats() {
  v1::GetStatsResponse stats;
  v1::DaemonStats* d = stats.mutable_daemon();
  d->set_version("9.9.9");
  d->set_backend(v1::BACKEND_HOST);
  d->set_uptime_s(303);
  d->set_sessions_live(1);
  d->set_sessions_total(4);
  d->set_stashes(16);
  d->set_bytes_stashed(3ULL << 30);
  d->set_stash_latency_p50_us(19);
  d->set_stash_latency_p99_us(230);
  d->set_stash_copy_gbps(12.44);
  v1::TierStats* gpu = stats.add_tiers();
  gpu->set_name("gpu0");
  gpu->set_pool(0);
  gpu->set_page_bytes(256 << 10);
  gpu->set_pages_total(256);
  gpu->set_pages_used(90);
  gpu->set_pages_free(166);
  gpu->set_pages_high_water(120);
  gpu->set_bytes_stashed(20ULL << 20);
  gpu->set_stashes_live(4);
  v1::TierStats* host = stats.add_tiers();
  host->set_name("host");
  host->set_pool(-1);
  host->set_page_bytes(256 << 10);
  host->set_pages_total(4096);
  v1::SessionStats* s = stats.add_sessions();
  s->set_session_id("0123456789abcdef0123456789abcdef");
  s->set_rank(7);
  s->set_pid(4242);
  s->set_pool(0);
  s->set_label("job-a");
  s->set_stashes(16);
  s->set_bytes_stashed(3ULL << 30);
  s->set_spills(2);
  s->set_overflows(1);
  s->set_pages_live(90);
  s->set_step_overflow(true);
  s->set_step_spilled(true);
  return stats;
}

TEST(StashctlFormat, StatsShowTheDaemonLineTiersWithBarsAndSessions) {
  const std::string text = RenderStats(SampleStats());
  EXPECT_NE(text.find("stashd 9.9.9  backend host  up 5m 03s  sessions 1 live / 4 total"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stashed 3 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("p50 19 us  p99 230 us"), std::string::npos) << text;
  EXPECT_NE(text.find("12.4 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu0  [#######.............]  35%"), std::string::npos) << text;
  EXPECT_NE(text.find("22.5 MiB / 64 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("host  [....................]   0%"), std::string::npos) << text;
  EXPECT_NE(text.find("0 B / 1 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("job-a"), std::string::npos) << text;
  EXPECT_NE(text.find("overflow,spilled"), std::string::npos) << text;
}

TEST(StashctlFormat, EveryColumnNamesItsUnitAndHighWaterShowsPagesAndBytes) {
  const std::string text = RenderStats(SampleStats());
  for (const char* header :
       {"USED/TOTAL PAGES", "USED / TOTAL BYTES", "PAYLOAD BYTES", "HIGH WATER PAGES",
        "HIGH WATER BYTES", "STASHED BYTES", "HELD BYTES", "HELD PAGES", "STEP FLAGS"}) {
    EXPECT_NE(text.find(header), std::string::npos) << header << "\n" << text;
  }
  // 120 pages of 256 KiB; then the chunks column ("-": the sample tier has none).
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(gpu0 .* 120 +30 MiB +4 +-\n)"))) << text;
  EXPECT_NE(text.find("LEASED/FREE/TOTAL CHUNKS"), std::string::npos) << text;
}

// Chunks neither in the pool nor leased get one line, naming why, and only when there are any.
TEST(StashctlFormat, ChunksOutOfThePoolAreNamedWithWhy) {
  v1::GetStatsResponse stats = SampleStats();
  EXPECT_EQ(RenderStats(stats).find("chunks out of the pool"), std::string::npos);
  v1::TierStats* gpu0 = stats.mutable_tiers(0);
  gpu0->set_chunks_total(32);
  gpu0->set_chunks_kept(2);
  gpu0->set_chunks_waiting(1);
  const std::string text = RenderStats(stats);
  EXPECT_NE(text.find("chunks out of the pool:  gpu0: 2 kept (returned by a live rank, until it "
                      "exits), 1 waiting for memory"),
            std::string::npos)
      << text;
}

TEST(StashctlFormat, SessionsDetailShowsLiveStashesByLayerMicrobatchAndName) {
  v1::GetStatsResponse stats = SampleStats();
  v1::LiveStashes* live = stats.mutable_sessions(0)->add_live();
  live->set_layer(7);
  live->set_microbatch(1);
  live->set_name("experts");
  live->set_stashes(2);
  live->set_bytes(3ULL << 20);
  live->set_pages(12);
  const std::string text = RenderSessions(stats.sessions(), 0, /*detail=*/true);
  EXPECT_NE(text.find("session 01234567 (rank 7, pool 0): live stashes by layer, microbatch and "
                      "name\nLAYER  MICROBATCH  NAME     STASHES  HELD BYTES  HELD PAGES\n"
                      "    7           1  experts        2       3 MiB          12\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(RenderSessions(stats.sessions()).find("LAYER"), std::string::npos);
}

// Issue 21: a mapped session's live stashes by tag under its lease, and those the rank's list
// did not hold said as a count, never as "holds no stashes".
TEST(StashctlFormat, SessionsDetailShowsAMappedSessionsLiveStashesAndTheUntagged) {
  v1::GetStatsResponse stats = SampleStats();
  v1::SessionStats* s = stats.mutable_sessions(0);
  s->set_mode(v1::MODE_MAPPED);
  v1::LeaseStats* lease = s->add_leases();
  lease->set_tier(v1::TIER_DEVICE);
  lease->set_chunks(2);
  lease->set_pages_leased(8);
  v1::LiveStashes* live = s->add_live();
  live->set_layer(3);
  live->set_microbatch(0);
  live->set_name("fc1");
  live->set_stashes(1);
  live->set_bytes(1ULL << 20);
  live->set_pages(4);
  s->set_live_untagged(2);
  const std::string text = RenderSessions(stats.sessions(), 0, /*detail=*/true);
  EXPECT_NE(text.find("mapped mode, lease by tier\n"), std::string::npos) << text;
  EXPECT_NE(text.find("live stashes by layer, microbatch and name\nLAYER  MICROBATCH  NAME  "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("    3           0  fc1         1       1 MiB           4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("2 live stashes not in the rank's list of tags"), std::string::npos) << text;
  s->clear_live();
  const std::string untagged = RenderSessions(stats.sessions(), 0, /*detail=*/true);
  EXPECT_EQ(untagged.find("holds no stashes"), std::string::npos) << untagged;
  EXPECT_NE(untagged.find("2 live stashes not in the rank's list of tags"), std::string::npos);
}

TEST(StashctlFormat, JsonShowsRankAndPidAsNumbers) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(SampleStats().sessions(0), &json, options).ok());
  EXPECT_NE(json.find("\"rank\":7,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\":4242,"), std::string::npos) << json;
}

// Issue 41: a GROUP column after LABEL only when a session is in a group; "-" for the others.
// JSON as stashctl prints it (every primitive field) has "group" only where one is set.
TEST(StashctlFormat, SessionsShowTheGroupOnlyWhenASessionIsInOne) {
  v1::GetStatsResponse stats = SampleStats();
  EXPECT_EQ(RenderSessions(stats.sessions()).find("GROUP"), std::string::npos);
  EXPECT_EQ(RenderStats(stats).find("GROUP"), std::string::npos);
  v1::SessionStats* plain = stats.add_sessions();
  *plain = stats.sessions(0);
  plain->set_session_id("fedcba9876543210fedcba9876543210");
  plain->set_label("job-b");
  stats.mutable_sessions(0)->set_group("torchrun:abc@10.0.0.1:29500");
  const std::string text = RenderSessions(stats.sessions());
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(LABEL +GROUP +AGE)"))) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(job-a +torchrun:abc@10.0.0.1:29500 )")))
      << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(job-b +- )"))) << text;
  EXPECT_NE(RenderStats(stats).find("GROUP"), std::string::npos);

  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;  // as stashctl --json
  std::string in_group;
  std::string no_group;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(stats.sessions(0), &in_group, options).ok());
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(stats.sessions(1), &no_group, options).ok());
  EXPECT_NE(in_group.find("\"group\":\"torchrun:abc@10.0.0.1:29500\""), std::string::npos)
      << in_group;
  EXPECT_EQ(no_group.find("\"group\""), std::string::npos) << no_group;
  EXPECT_NE(no_group.find("\"label\":\"job-b\""), std::string::npos) << no_group;
}

TEST(StashctlFormat, SessionsShowBytesHeldNowBesideTheTotalAndTheStepBesideItsFlags) {
  v1::GetStatsResponse stats = SampleStats();
  v1::SessionStats* s = stats.mutable_sessions(0);
  s->set_bytes_live(22ULL << 20);
  s->set_step(41);
  s->set_step_begun(true);
  const std::string text = RenderSessions(stats.sessions());
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(3 GiB +22 MiB +90 )"))) << text;
  EXPECT_NE(text.find("41 overflow,spilled"), std::string::npos) << text;
  s->set_step_overflow(false);
  s->set_step_spilled(false);
  EXPECT_NE(RenderSessions(stats.sessions()).find("  41\n"), std::string::npos)
      << RenderSessions(stats.sessions());
}

TEST(StashctlFormat, TheLatencyLineSaysWhenItsFiguresIncludeTheWarmUp) {
  v1::DaemonStats d;
  d.set_stashes(100);
  EXPECT_EQ(WarmUpNote(d), "");  // no warm-up (or the cuda backend)
  d.set_warming(true);
  EXPECT_NE(WarmUpNote(d).find("tiers still warming"), std::string::npos);
  d.set_warming(false);
  d.set_warm_after_s(3.25);
  d.set_stashes_while_warming(40);
  EXPECT_EQ(WarmUpNote(d),
            "  (includes 40 stashes made while the tiers warmed, until 3.2 s after start)");
  // 4096 later stashes pushed 30 of them out of the window, then all of them.
  d.set_stashes(4126);
  EXPECT_NE(WarmUpNote(d).find("includes 10 stashes"), std::string::npos) << WarmUpNote(d);
  d.set_stashes(4136);
  EXPECT_EQ(WarmUpNote(d), "");
  v1::GetStatsResponse stats = SampleStats();
  stats.mutable_daemon()->set_warming(true);
  EXPECT_NE(RenderStats(stats).find("(tiers still warming"), std::string::npos);
}

TEST(StashctlFormat, StatsTierColumnsLineUp) {
  const std::vector<std::string> lines = Lines(RenderStats(SampleStats()));
  std::vector<std::string> tier_lines;
  for (const std::string& line : lines) {
    if (line.rfind("TIER", 0) == 0 || line.rfind("gpu0", 0) == 0 || line.rfind("host", 0) == 0) {
      tier_lines.push_back(line);
    }
  }
  ASSERT_EQ(tier_lines.size(), 3u);
  // Right-aligned columns end at the same place: every line is as long as the header.
  EXPECT_EQ(tier_lines[1].size(), tier_lines[0].size());
  EXPECT_EQ(tier_lines[2].size(), tier_lines[0].size());
  // The bars start in the same column.
  EXPECT_EQ(tier_lines[1].find('['), tier_lines[2].find('['));
}

TEST(StashctlFormat, StatsSayWhenNoSessionIsConnected) {
  v1::GetStatsResponse stats = SampleStats();
  stats.clear_sessions();
  EXPECT_NE(RenderStats(stats).find("no sessions connected"), std::string::npos);
}

// A TCP listener without --listen-sessions (or a daemon past its row cap) leaves rows out: the
// tables say how many, instead of "no sessions connected".
TEST(StashctlFormat, OmittedSessionsAreCountedNotHidden) {
  v1::GetStatsResponse stats = SampleStats();
  stats.clear_sessions();
  stats.set_sessions_omitted(3);
  std::string text = RenderStats(stats);
  EXPECT_EQ(text.find("no sessions connected"), std::string::npos) << text;
  EXPECT_NE(text.find("3 sessions not shown"), std::string::npos) << text;
  text = RenderSessions(stats.sessions(), 1);
  EXPECT_NE(text.find("1 session not shown"), std::string::npos) << text;
  stats = SampleStats();
  stats.set_sessions_omitted(2);
  text = RenderSessions(stats.sessions(), stats.sessions_omitted());
  EXPECT_EQ(text.rfind("SESSION", 0), 0u) << text;
  EXPECT_NE(text.find("2 sessions not shown"), std::string::npos) << text;
  EXPECT_EQ(RenderSessions(stats.sessions(), 0).find("not shown"), std::string::npos);
}

TEST(StashctlFormat, SessionsTableShowsTheSessionIdPrefixAndUnknownRankAsDash) {
  v1::GetStatsResponse stats = SampleStats();
  stats.mutable_sessions(0)->set_rank(-1);
  const std::string text = RenderSessions(stats.sessions());
  EXPECT_EQ(text.rfind("SESSION", 0), 0u) << text;
  EXPECT_NE(text.find("\n01234567     -  4242"), std::string::npos) << text;
  EXPECT_EQ(text.find("0123456789"), std::string::npos) << text;
}

TEST(StashctlFormat, ConfigShowsGeometryAndEveryKnob) {
  v1::GetConfigResponse config;
  config.set_version("9.9.9");
  config.set_backend(v1::BACKEND_HOST);
  config.set_socket("/tmp/s.sock");
  config.set_pools(2);
  config.set_page_bytes(256 << 10);
  config.set_pool_pages(256);
  config.set_host_tier_pages(0);
  v1::ConfigEntry* e = config.add_entries();
  e->set_name("pool_bytes");
  e->set_value("64MiB");
  e->set_source("flag");
  e->set_help("Pool size per GPU");
  const std::string text = RenderConfig(config);
  EXPECT_NE(text.find("socket /tmp/s.sock"), std::string::npos) << text;
  EXPECT_NE(text.find("pools 2 x 64 MiB (256 pages of 256 KiB)  host tier none"), std::string::npos)
      << text;
  EXPECT_NE(text.find("pool_bytes  64MiB  flag    Pool size per GPU"), std::string::npos) << text;
}

// ------------------------------------------------------------------------------------------------
// Command line
// ------------------------------------------------------------------------------------------------

TEST(StashctlArgs, UnknownCommandExitsTwoWithOneLine) {
  const Outcome o = RunInProcess({"frobnicate"});
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_EQ(Lines(o.err).size(), 1u) << o.err;
  EXPECT_NE(o.err.find("unknown command 'frobnicate'"), std::string::npos) << o.err;
  EXPECT_TRUE(o.out.empty());
}

TEST(StashctlArgs, UnknownFlagExitsTwoWithOneLine) {
  const Outcome o = RunInProcess({"stats", "--frobnicate=1"});
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_EQ(Lines(o.err).size(), 1u) << o.err;
  EXPECT_NE(o.err.find("unknown flag '--frobnicate'"), std::string::npos) << o.err;
}

TEST(StashctlArgs, MissingCommandExitsTwo) {
  const Outcome o = RunInProcess({});
  EXPECT_EQ(o.exit_code, kExitUsage);
  EXPECT_NE(o.err.find("no command given"), std::string::npos) << o.err;
}

TEST(StashctlArgs, BadValuesExitTwoNamingTheFlag) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"stats", "--watch=0"},
                                             {"stats", "--watch", "soon"},
                                             {"stats", "--count=3"},
                                             {"stats", "--watch=1", "--count=0"},
                                             {"stats", "--timeout=-1"},
                                             {"stats", "--target=nohost"},
                                             {"stats", "--socket=/a", "--target=127.0.0.1:1"},
                                             {"stats", "--json=perhaps"},
                                             {"stats", "sessions"},
                                             {"stats", "--watch"}}) {
    const Outcome o = RunInProcess(args);
    EXPECT_EQ(o.exit_code, kExitUsage) << args.back();
    EXPECT_EQ(Lines(o.err).size(), 1u) << o.err;
    EXPECT_EQ(o.err.rfind("stashctl: ", 0), 0u) << o.err;
  }
}

TEST(StashctlArgs, HelpExitsZeroAndDocumentsEveryCommandAndFlag) {
  const Outcome o = RunInProcess({"--help"});
  EXPECT_EQ(o.exit_code, kExitOk);
  for (const char* word : {"stats", "sessions", "config", "health", "--socket", "--target",
                           "--json", "--watch", "--count", "--timeout", "--version", "--help",
                           "STASHD_SOCKET", "Examples:", "Exit status"}) {
    EXPECT_NE(o.out.find(word), std::string::npos) << word;
  }
  EXPECT_TRUE(o.err.empty());
}

TEST(StashctlArgs, HelpWinsOverAnUnknownCommand) {
  EXPECT_EQ(RunInProcess({"stats", "-h"}).exit_code, kExitOk);
}

TEST(StashctlArgs, VersionPrintsTheVersion) {
  const Outcome o = RunInProcess({"--version"});
  EXPECT_EQ(o.exit_code, kExitOk);
  EXPECT_EQ(o.out.rfind("stashctl ", 0), 0u) << o.out;
}

TEST(StashctlArgs, FlagsGoBeforeOrAfterTheCommandWithDashesOrUnderscores) {
  Argv argv({"--json", "sessions", "--watch", "2.5", "--count=3", "--socket=/x/s.sock", "--timeout",
             "7"});
  const StatusOr<CommandLine> parsed = ParseCommandLine(argv.argc(), argv.argv());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Options& o = parsed->options;
  EXPECT_EQ(o.command, Command::kSessions);
  EXPECT_TRUE(o.json);
  EXPECT_DOUBLE_EQ(o.watch_s, 2.5);
  EXPECT_EQ(o.count, 3);
  EXPECT_EQ(o.socket, "/x/s.sock");
  EXPECT_DOUBLE_EQ(o.timeout_s, 7);
  EXPECT_TRUE(o.target.empty());
}

TEST(StashctlArgs, ParsingKeepsNoStateBetweenCalls) {
  Argv first({"stats", "--json", "--watch=3"});
  ASSERT_TRUE(ParseCommandLine(first.argc(), first.argv()).ok());
  Argv second({"health", "--socket=/y/s.sock"});
  const StatusOr<CommandLine> parsed = ParseCommandLine(second.argc(), second.argv());
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->options.json);
  EXPECT_EQ(parsed->options.watch_s, 0);
  EXPECT_DOUBLE_EQ(parsed->options.timeout_s, 2);
}

TEST(StashctlArgs, SocketComesFromTheEnvironmentWhenNoFlagNamesOne) {
  ScopedEnv env("STASHD_SOCKET", "/from/env.sock");
  Argv plain({"stats"});
  StatusOr<CommandLine> parsed = ParseCommandLine(plain.argc(), plain.argv());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->options.socket, "/from/env.sock");
  Argv flagged({"stats", "--socket=/from/flag.sock"});
  parsed = ParseCommandLine(flagged.argc(), flagged.argv());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->options.socket, "/from/flag.sock");
}

TEST(StashctlArgs, TargetReplacesTheSocket) {
  Argv argv({"stats", "--target", "127.0.0.1:7070"});
  const StatusOr<CommandLine> parsed = ParseCommandLine(argv.argc(), argv.argv());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->options.target, "127.0.0.1:7070");
  EXPECT_TRUE(parsed->options.socket.empty());
}

TEST(StashctlArgs, NoDaemonGivesOneLineNamingTheSocketAndExitsOne) {
  char dir_template[] = "/tmp/stashctl-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string socket = std::string(dir_template) + "/absent/s.sock";
  const Outcome o = RunInProcess({"stats", "--socket", socket});
  rmdir(dir_template);
  EXPECT_EQ(o.exit_code, kExitFailure);
  EXPECT_TRUE(o.out.empty());
  ASSERT_EQ(Lines(o.err).size(), 1u) << o.err;
  EXPECT_EQ(o.err, "stashctl: no stashd answers on " + socket +
                       ": start it with 'stashd --socket=" + socket +
                       "' or point STASHD_SOCKET at a running one\n");
}

// ------------------------------------------------------------------------------------------------
// End to end: the built binaries
// ------------------------------------------------------------------------------------------------

std::string BinDir() {
  if (const char* dir = std::getenv("STASHD_BIN_DIR"); dir != nullptr && *dir != '\0') return dir;
  return STASH_TEST_BIN_DIR;
}
std::string StashdBinary() { return BinDir() + "/daemon/stashd"; }
std::string StashctlBinary() { return BinDir() + "/client/stashctl/stashctl"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The environment without STASHD_* variables, so the caller's settings cannot leak in, plus
// `extra` ("NAME=value").
std::vector<std::string> CleanEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("STASHD_", 0) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Starts `binary args...` with stdout and stderr going to the given files and SIGINT at its
// default action, in CleanEnvironment(extra_env). Returns the pid, or -1.
pid_t Spawn(const std::string& binary, const std::vector<std::string>& args,
            const std::string& out_path, const std::string& err_path,
            const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_storage.size() + 1);
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_storage = CleanEnvironment(extra_env);
  std::vector<char*> env;
  env.reserve(env_storage.size() + 1);
  for (std::string& e : env_storage) env.push_back(e.data());
  env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, argv.data(), env.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// Waits up to `limit` for `pid` to end; its wait status, or nullopt when it still runs.
std::optional<int> WaitFor(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling, bounded above
  }
}

// A temp dir per test; a real stashd in it for StashctlWithDaemon.
class StashctlBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/stashctl-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    socket_ = dir_ + "/s.sock";
    ASSERT_EQ(access(StashctlBinary().c_str(), X_OK), 0)
        << StashctlBinary() << " is missing: build the stashctl target (or set STASHD_BIN_DIR)";
  }

  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Runs the stashctl binary to completion.
  Outcome Stashctl(const std::vector<std::string>& args,
                   const std::vector<std::string>& extra_env = {}) {
    const std::string out = dir_ + "/ctl.out";
    const std::string err = dir_ + "/ctl.err";
    Outcome outcome;
    const pid_t pid = Spawn(StashctlBinary(), args, out, err, extra_env);
    if (pid < 0) return outcome;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.out = ReadFile(out);
    outcome.err = ReadFile(err);
    return outcome;
  }

  std::string dir_;
  std::string socket_;
};

class StashctlWithDaemon : public StashctlBinaryTest {
 protected:
  void SetUp() override {
    StashctlBinaryTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(access(StashdBinary().c_str(), X_OK), 0)
        << StashdBinary() << " is missing: build the stashd target (or set STASHD_BIN_DIR)";
    log_ = dir_ + "/stashd.log";
    daemon_ = Spawn(StashdBinary(),
                    {"--socket=" + socket_, "--backend=host", "--devices=2", "--pool-bytes=16MiB",
                     "--host-tier-bytes=8MiB", "--log-level=warn"},
                    log_, log_ + ".err");
    ASSERT_GT(daemon_, 0) << "cannot start " << StashdBinary();
    // Ready when `stashctl health` says so; a daemon that died says why in its log.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      if (Stashctl({"health", "--socket", socket_, "--timeout=1"}).exit_code == 0) return;
      if (const std::optional<int> status = WaitFor(daemon_, std::chrono::milliseconds(50))) {
        daemon_ = -1;
        FAIL() << "stashd exited (status " << *status << ") before answering:\n"
               << ReadFile(log_ + ".err");
      }
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "stashd did not answer health within 10 s:\n"
          << ReadFile(log_ + ".err");
    }
  }

  void TearDown() override {
    if (daemon_ > 0) {
      kill(daemon_, SIGTERM);
      if (!WaitFor(daemon_, std::chrono::seconds(5))) {
        kill(daemon_, SIGKILL);
        waitpid(daemon_, nullptr, 0);
      }
      daemon_ = -1;
    }
    if (HasFailure()) std::cerr << "stashd log:\n" << ReadFile(log_ + ".err");
    StashctlBinaryTest::TearDown();
  }

  pid_t daemon_ = -1;
  std::string log_;
};

TEST_F(StashctlWithDaemon, VersionShowsTheDaemonsVersionToo) {
  const Outcome o = Stashctl({"--version", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out.rfind("stashctl ", 0), 0U) << o.out;
  EXPECT_NE(o.out.find("\nstashd " STASH_VERSION_STRING " (" + socket_ + ")\n"), std::string::npos)
      << o.out;
}

TEST_F(StashctlWithDaemon, VersionJsonIsOneObjectWithBothVersions) {
  const Outcome o = Stashctl({"--version", "--json", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  // One object, one field a line (protobuf's Struct is not used: it crashes under TSan here).
  EXPECT_EQ(o.out, "{\n \"stashctl\": \"" STASH_VERSION_STRING
                   "\",\n \"stashd\": \"" STASH_VERSION_STRING "\",\n \"daemon\": \"" +
                       socket_ + "\"\n}\n");
  const Outcome down = Stashctl({"--version", "--json", "--socket", dir_ + "/none.sock"});
  EXPECT_EQ(down.out.rfind("{\n", 0), 0U) << down.out;
  EXPECT_NE(down.out.find("\n \"stashd\": null,\n"), std::string::npos) << down.out;
  EXPECT_NE(down.out.find("\n \"error\": \"no stashd answers"), std::string::npos) << down.out;
  ASSERT_GE(down.out.size(), 4U);
  EXPECT_EQ(down.out.substr(down.out.size() - 4), "\"\n}\n") << down.out;
}

TEST_F(StashctlWithDaemon, CsvQueryPrintsTheChosenFieldsOfEachTier) {
  const Outcome o =
      Stashctl({"stats", "--format=csv", "--query=name,pages_total", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "name,pages_total\ngpu0,64\ngpu1,64\nhost,32\n");
}

TEST_F(StashctlWithDaemon, TablesFitColumns) {
  const Outcome o = Stashctl({"config", "--socket", socket_}, {"COLUMNS=60"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  for (const std::string& line : Lines(o.out)) EXPECT_LE(DisplayWidth(line), 60u) << line;
}

TEST_F(StashctlBinaryTest, VersionSaysWhenNoDaemonAnswers) {
  const Outcome o = Stashctl({"--version", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\nstashd: unknown, no stashd answers on " + socket_), std::string::npos)
      << o.out;
}

TEST_F(StashctlWithDaemon, HealthSaysServingWhenDaemonRuns) {
  const Outcome o = Stashctl({"health", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "SERVING\n");
  EXPECT_TRUE(o.err.empty()) << o.err;
}

TEST_F(StashctlWithDaemon, StatsJsonParsesBackAndListsEveryTier) {
  const Outcome o = Stashctl({"stats", "--json", "--socket=" + socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  v1::GetStatsResponse stats;
  const auto status = google::protobuf::util::JsonStringToMessage(o.out, &stats);
  ASSERT_TRUE(status.ok()) << status.ToString() << "\n" << o.out;
  ASSERT_EQ(stats.tiers_size(), 3) << o.out;  // --devices=2 pools, then the host tier
  EXPECT_EQ(stats.tiers(0).name(), "gpu0");
  EXPECT_EQ(stats.tiers(1).name(), "gpu1");
  EXPECT_EQ(stats.tiers(2).name(), "host");
  EXPECT_EQ(stats.tiers(0).pages_total() * stats.tiers(0).page_bytes(), 16ULL << 20);
  EXPECT_EQ(stats.daemon().backend(), v1::BACKEND_HOST);
  // Chunks: every tier is cut into chunks of one size, a device pool (16 MiB) / 32 in whole
  // pages; nothing is leased yet, so every chunk is free.
  for (const v1::TierStats& t : stats.tiers()) {
    EXPECT_EQ(t.chunk_bytes(), (16ULL << 20) / 32) << t.name();
    EXPECT_EQ(t.chunk_bytes() % t.page_bytes(), 0u) << t.name();
    EXPECT_EQ(t.chunks_total(),
              (t.pages_total() * t.page_bytes() + t.chunk_bytes() - 1) / t.chunk_bytes())
        << t.name();
    EXPECT_EQ(t.chunks_free(), t.chunks_total()) << t.name();
    EXPECT_EQ(t.chunks_leased(), 0u) << t.name();
    EXPECT_EQ(t.chunks_orphaned(), 0u) << t.name();
  }
  EXPECT_EQ(stats.tiers(0).chunks_total(), 32u);
  EXPECT_EQ(stats.tiers(2).chunks_total(), 16u);
  // Stable names for scripts: proto field names, zeros printed too.
  EXPECT_NE(o.out.find("\"pages_high_water\""), std::string::npos);
  EXPECT_NE(o.out.find("\"sessions_live\""), std::string::npos);
  EXPECT_NE(o.out.find("\"chunks_free\""), std::string::npos);
}

TEST_F(StashctlWithDaemon, ConfigJsonShowsPoolBytes) {
  const Outcome o = Stashctl({"config", "--json", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  v1::GetConfigResponse config;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(o.out, &config).ok()) << o.out;
  EXPECT_EQ(config.pools(), 2u);
  bool found = false;
  for (const v1::ConfigEntry& e : config.entries()) {
    if (e.name() == "pool_bytes") {
      found = true;
      EXPECT_EQ(e.value(), "16MiB");
      EXPECT_EQ(e.source(), "flag");
    }
  }
  EXPECT_TRUE(found) << o.out;
}

TEST_F(StashctlWithDaemon, ConfigTableShowsTheSocket) {
  const Outcome o = Stashctl({"config", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("socket " + socket_), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("pool_bytes"), std::string::npos) << o.out;
}

TEST_F(StashctlWithDaemon, StatsTableNamesEveryTier) {
  const Outcome o = Stashctl({"stats", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\ngpu0  ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\ngpu1  ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\nhost  ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("no sessions connected"), std::string::npos) << o.out;
}

TEST_F(StashctlWithDaemon, SessionsSaysNoneWhenNoRankIsConnected) {
  const Outcome o = Stashctl({"sessions", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "no sessions connected\n");
}

// sessions --json: the session rows, the groups and the tiers (whose page_bytes size the groups'
// pages) of one GetStats reply; the daemon lines are stats'.
TEST_F(StashctlWithDaemon, SessionsJsonHasSessionsGroupsAndTiers) {
  const Outcome o = Stashctl({"sessions", "--json", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const char* key :
       {R"("sessions": [])", R"("sessions_omitted": "0")", R"("groups": [])", R"("tiers": [)"}) {
    EXPECT_NE(o.out.find(key), std::string::npos) << key << "\n" << o.out;
  }
  EXPECT_EQ(o.out.find(R"("daemon")"), std::string::npos) << o.out;
}

TEST_F(StashctlWithDaemon, SocketComesFromStashdSocketWithoutAFlag) {
  const Outcome o = Stashctl({"health"}, {"STASHD_SOCKET=" + socket_});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "SERVING\n");
}

TEST_F(StashctlWithDaemon, WatchPrintsOneFramePerCount) {
  const Outcome o = Stashctl({"--watch", "0.2", "--count", "2", "stats", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(CountOf(o.out, "Every 0.2s: stashctl stats on " + socket_), 2u) << o.out;
  EXPECT_EQ(CountOf(o.out, "\ngpu0  ["), 2u) << o.out;
  // Not a terminal: no escape codes, frames separated by a blank line.
  EXPECT_EQ(o.out.find('\033'), std::string::npos);
  EXPECT_NE(o.out.find("\n\nEvery 0.2s"), std::string::npos) << o.out;
}

TEST_F(StashctlWithDaemon, WatchJsonPrintsOneObjectPerLine) {
  const Outcome o = Stashctl({"--watch=0.2", "--count=3", "--json", "health", "--socket", socket_});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out,
            "{\"status\":\"SERVING\"}\n{\"status\":\"SERVING\"}\n{\"status\":\"SERVING\"}\n");
}

TEST_F(StashctlWithDaemon, WatchStopsOnSigint) {
  const std::string out = dir_ + "/watch.out";
  const pid_t pid =
      Spawn(StashctlBinary(), {"--watch=0.2", "stats", "--socket", socket_}, out, out + ".err");
  ASSERT_GT(pid, 0);
  // Interrupt once the first frame is out, as a person would.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ReadFile(out).find("host  [") == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline ||
        WaitFor(pid, std::chrono::milliseconds(20))) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      FAIL() << "no frame from stashctl --watch:\n" << ReadFile(out + ".err");
    }
  }
  kill(pid, SIGINT);
  const std::optional<int> status = WaitFor(pid, std::chrono::seconds(5));
  if (!status) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "stashctl --watch did not stop on SIGINT";
  }
  EXPECT_TRUE(WIFEXITED(*status)) << "status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST_F(StashctlWithDaemon, DrainRefusesNewWorkWithoutStoppingAndStatsSayIt) {
  const Outcome drain = Stashctl({"drain", "--socket", socket_});
  EXPECT_EQ(drain.exit_code, 0) << drain.err;
  EXPECT_NE(drain.out.find("draining: stashd on " + socket_ +
                           " refuses new sessions and stashes; 0 session(s) hold 0"),
            std::string::npos)
      << drain.out;
  // Not ready for new work (readiness), still alive (liveness), and saying it drains.
  EXPECT_EQ(Stashctl({"health", "--socket", socket_}).out, "NOT_SERVING\n");
  EXPECT_EQ(Stashctl({"health", "--socket", socket_, "--service=stash.v1.StashService"}).out,
            "SERVING\n");
  const Outcome stats = Stashctl({"stats", "--socket", socket_});
  EXPECT_NE(stats.out.find("  DRAINING\n"), std::string::npos) << stats.out;
  EXPECT_EQ(Stashctl({"drain", "--socket", socket_}).exit_code, 0);  // idempotent
}

TEST_F(StashctlWithDaemon, DaemonStopsCleanlyOnSigtermAndRemovesItsSocket) {
  ASSERT_EQ(kill(daemon_, SIGTERM), 0);
  const std::optional<int> status = WaitFor(daemon_, std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value()) << "stashd still runs 5 s after SIGTERM";
  daemon_ = -1;
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  // And stashctl now says nobody answers there.
  const Outcome o = Stashctl({"health", "--socket", socket_});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no stashd answers on " + socket_), std::string::npos) << o.err;
}

TEST_F(StashctlBinaryTest, NoDaemonExitsOneWithOneLineNamingTheSocket) {
  const std::string socket = dir_ + "/nonexistent/s.sock";
  const Outcome o = Stashctl({"stats", "--socket", socket});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(o.out.empty()) << o.out;
  ASSERT_EQ(Lines(o.err).size(), 1u) << o.err;
  EXPECT_NE(o.err.find("no stashd answers on " + socket), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("'stashd --socket=" + socket + "'"), std::string::npos) << o.err;
}

TEST_F(StashctlBinaryTest, UnknownCommandExitsTwo) {
  const Outcome o = Stashctl({"frobnicate"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(Lines(o.err).size(), 1u) << o.err;
}

}  // namespace
}  // namespace stash::stashctl

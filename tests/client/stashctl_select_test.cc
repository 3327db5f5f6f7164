// stashctl's habits from the shell: tables that fit the terminal, sessions filtered and sorted,
// CSV with chosen fields (--query, --format=csv), and the flags that ask for them.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include "client/stashctl/format.h"
#include "client/stashctl/select.h"
#include "client/stashctl/stashctl.h"

namespace stash::stashctl {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

size_t Widest(const std::string& text) {
  size_t widest = 0;
  for (const std::string& line : Lines(text)) widest = std::max(widest, DisplayWidth(line));
  return widest;
}

v1::SessionStats Session(int64_t rank, uint32_t pid, const std::string& label, uint64_t held) {
  v1::SessionStats s;
  s.set_session_id("0123456789abcdef" + std::to_string(rank));
  s.set_rank(rank);
  s.set_pid(pid);
  s.set_label(label);
  s.set_bytes_live(held);
  s.set_stashes(10 * static_cast<uint64_t>(rank));
  return s;
}

google::protobuf::RepeatedPtrField<v1::SessionStats> FourSessions() {
  google::protobuf::RepeatedPtrField<v1::SessionStats> out;
  *out.Add() = Session(0, 300, "llama-moe-pretrain-run-0042", 5 << 20);
  *out.Add() = Session(1, 100, "llama-moe-pretrain-run-0042", 9 << 20);
  *out.Add() = Session(2, 400, "mixtral-sft", 1 << 20);
  *out.Add() = Session(3, 200, "mixtral-sft", 7 << 20);
  return out;
}

std::vector<int64_t> Ranks(const google::protobuf::RepeatedPtrField<v1::SessionStats>& s) {
  std::vector<int64_t> out;
  for (const v1::SessionStats& row : s) out.push_back(row.rank());
  return out;
}

// --- Tables that fit ------------------------------------------------------------------------

TEST(StashctlWidth, SessionTableFitsTheWidthItIsGiven) {
  const auto sessions = FourSessions();
  const std::string wide = RenderSessions(sessions);
  ASSERT_GT(Widest(wide), 120u) << wide;
  for (size_t width : {120u, 100u, 80u, 60u}) {
    const std::string narrow = RenderSessions(sessions, 0, false, width);
    EXPECT_LE(Widest(narrow), width) << narrow;
    // Rank, pid, label (maybe cut) and what each holds always show.
    const std::string header = Lines(narrow)[0];
    for (const char* kept : {"RANK", "PID", "LABEL", "HELD BYTES"}) {
      EXPECT_NE(header.find(kept), std::string::npos) << width << ": " << header;
    }
  }
}

TEST(StashctlWidth, NarrowsColumnsBeforeDroppingThem) {
  const auto sessions = FourSessions();
  const std::string wide = RenderSessions(sessions);
  const size_t full = Widest(wide);
  // A few cells short: the long label is cut ('~'), every column stays.
  const std::string cut = RenderSessions(sessions, 0, false, full - 6);
  EXPECT_LE(Widest(cut), full - 6);
  EXPECT_NE(cut.find("llama-moe-pr"), std::string::npos) << cut;
  EXPECT_NE(cut.find("~"), std::string::npos) << cut;
  const std::string cut_header = Lines(cut)[0];
  for (const char* column : {"SESSION", "POOL", "AGE", "MODE", "STASHES", "RELOADS",
                             "STASHED BYTES", "HELD PAGES", "REJECTED", "STEP FLAGS"}) {
    EXPECT_NE(cut_header.find(column), std::string::npos) << column << " went: " << cut_header;
  }
  // Much narrower: columns go.
  const std::string few = RenderSessions(sessions, 0, false, 70);
  EXPECT_EQ(Lines(few)[0].find("HELD PAGES"), std::string::npos) << few;
}

TEST(StashctlWidth, UnlimitedWidthChangesNothing) {
  const auto sessions = FourSessions();
  EXPECT_EQ(RenderSessions(sessions, 0, false, 0), RenderSessions(sessions));
  EXPECT_EQ(RenderSessions(sessions, 0, false, 10000), RenderSessions(sessions));
}

TEST(StashctlWidth, ConfigCutsTheHelpThenLeavesItOut) {
  v1::GetConfigResponse config;
  v1::ConfigEntry* e = config.add_entries();
  e->set_name("pool_bytes");
  e->set_value("16GiB");
  e->set_source("env");
  e->set_help("Stash pool per GPU, allocated once at start; a size like 16GiB (B, KiB, MiB, GiB)");
  const std::string at70 = RenderConfig(config, 70);
  EXPECT_LE(Widest(at70), 70u) << at70;
  EXPECT_NE(at70.find("Stash pool per GPU"), std::string::npos) << at70;
  const std::string at40 = RenderConfig(config, 40);
  EXPECT_EQ(Lines(at40).back().find("Stash pool"), std::string::npos) << at40;
  EXPECT_NE(Lines(at40).back().find("16GiB"), std::string::npos) << at40;
}

TEST(StashctlWidth, TruncateCountsCodePointsAndMarksTheCut) {
  EXPECT_EQ(Truncate("abcdef", 6), "abcdef");
  EXPECT_EQ(Truncate("abcdef", 4), "abc~");
  EXPECT_EQ(Truncate("\xc3\xa9t\xc3\xa9-long", 4), "\xc3\xa9t\xc3\xa9~");
}

TEST(StashctlWidth, ColumnsAndTheTtyGiveTheWidth) {
  setenv("COLUMNS", "77", 1);
  EXPECT_EQ(TerminalWidth(false), 77u);
  setenv("COLUMNS", "wide", 1);
  EXPECT_EQ(TerminalWidth(false), 0u);  // not a number, and not a terminal: no limit
  unsetenv("COLUMNS");
  EXPECT_EQ(TerminalWidth(false), 0u);
}

// --- Filter and sort ------------------------------------------------------------------------

TEST(StashctlSelect, FiltersByLabelGlobRankAndPid) {
  auto s = FourSessions();
  SelectSessions({"mixtral-*", std::nullopt, std::nullopt, ""}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{2, 3}));
  s = FourSessions();
  SelectSessions({"", 1, std::nullopt, ""}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{1}));
  s = FourSessions();
  SelectSessions({"", std::nullopt, 400, ""}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{2}));
  s = FourSessions();
  SelectSessions({"nobody", std::nullopt, std::nullopt, ""}, &s);
  EXPECT_TRUE(s.empty());
}

TEST(StashctlSelect, SortsByHeldBytesLargestFirstAndByPidOrLabel) {
  auto s = FourSessions();
  SelectSessions({"", std::nullopt, std::nullopt, "held"}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{1, 3, 0, 2}));
  s = FourSessions();
  SelectSessions({"", std::nullopt, std::nullopt, "pid"}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{1, 3, 0, 2}));
  s = FourSessions();
  SelectSessions({"", std::nullopt, std::nullopt, "label"}, &s);
  EXPECT_EQ(Ranks(s), (std::vector<int64_t>{0, 1, 2, 3}));  // ties keep the daemon's order
}

// --- CSV --------------------------------------------------------------------------------------

TEST(StashctlCsv, PrintsTheQueriedFieldsInOrder) {
  const auto s = FourSessions();
  const auto fields = ResolveQuery(*v1::SessionStats::descriptor(), {"rank", "pid", "bytes_live"});
  ASSERT_TRUE(fields.ok()) << fields.status().ToString();
  EXPECT_EQ(RenderCsv(s, *fields, true),
            "rank,pid,bytes_live\n0,300,5242880\n1,100,9437184\n2,400,1048576\n3,200,7340032\n");
  EXPECT_EQ(Lines(RenderCsv(s, *fields, false)).size(), 4u);
}

TEST(StashctlCsv, QuotesCellsWithCommasAndQuotesAndNamesEnums) {
  google::protobuf::RepeatedPtrField<v1::SessionStats> s;
  *s.Add() = Session(0, 1, "a,b \"c\"\n", 0);
  s.Mutable(0)->set_mode(v1::MODE_MAPPED);
  s.Mutable(0)->set_step_overflow(true);
  EXPECT_EQ(RenderCsv(s, {"label", "mode", "step_overflow"}, false),
            "\"a,b \"\"c\"\"?\",MODE_MAPPED,true\n");
}

TEST(StashctlCsv, AnUnknownFieldListsTheValidOnes) {
  const auto bad = ResolveQuery(*v1::TierStats::descriptor(), {"name", "bogus"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'bogus'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("pages_used"), std::string::npos);
  const auto all = ResolveQuery(*v1::TierStats::descriptor(), {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->front(), QueryableFields(*v1::TierStats::descriptor()).front());
}

// --- The flags --------------------------------------------------------------------------------

StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "stashctl");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(args.size()), argv.data());
}

TEST(StashctlSelectArgs, QueryAndFormatLikeNvidiaSmi) {
  auto parsed = Parse({"sessions", "--query=rank,label", "--format=csv,noheader", "--socket=/x"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->options.csv);
  EXPECT_FALSE(parsed->options.csv_header);
  EXPECT_EQ(parsed->options.query, (std::vector<std::string>{"rank", "label"}));
  parsed = Parse({"stats", "--format", "csv", "--socket=/x"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->options.query, QueryableFields(*v1::TierStats::descriptor()));
}

TEST(StashctlSelectArgs, MistakesSayWhatToChange) {
  auto bad = Parse({"sessions", "--query=rank", "--socket=/x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--format=csv"), std::string::npos);
  bad = Parse({"sessions", "--format=csv", "--query=rank,nope", "--socket=/x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'nope'"), std::string::npos);
  bad = Parse({"health", "--format=csv", "--socket=/x"});
  ASSERT_FALSE(bad.ok());
  bad = Parse({"config", "--sort=held", "--socket=/x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stats or sessions"), std::string::npos);
  EXPECT_FALSE(Parse({"sessions", "--sort=age", "--socket=/x"}).ok());
  EXPECT_FALSE(Parse({"sessions", "--format=xml", "--socket=/x"}).ok());
  EXPECT_FALSE(Parse({"sessions", "--query=rank,,pid", "--format=csv", "--socket=/x"}).ok());
  EXPECT_FALSE(Parse({"sessions", "--pid=0", "--socket=/x"}).ok());
}

TEST(StashctlSelectArgs, FiltersAndSortParse) {
  auto parsed =
      Parse({"sessions", "--label=llama-*", "--rank=3", "--pid=42", "--sort=held", "--socket=/x"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const SessionSelection& s = parsed->options.selection;
  EXPECT_EQ(s.label, "llama-*");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.pid, 42);
  EXPECT_EQ(s.sort, "held");
}

}  // namespace
}  // namespace stash::stashctl

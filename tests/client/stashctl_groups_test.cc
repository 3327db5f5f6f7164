// stashctl's groups table (`stats`, `sessions`, `sessions --detail`) and which groups a session
// filter keeps: pure functions of a hand-built GetStats reply, no daemon.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>

#include "client/stashctl/format.h"
#include "client/stashctl/select.h"
#include "stash/v1/stash.pb.h"

namespace stash::stashctl {
namespace {

constexpr uint64_t kPage = 256 << 10;

void AddTier(v1::GetStatsResponse* stats, const std::string& name, int pool) {
  v1::TierStats* t = stats->add_tiers();
  t->set_name(name);
  t->set_pool(pool);
  t->set_page_bytes(kPage);
  t->set_pages_total(4096);
}

v1::SessionStats* AddSession(v1::GetStatsResponse* stats, const std::string& id, int64_t rank,
                             const std::string& label, const std::string& group) {
  v1::SessionStats* s = stats->add_sessions();
  s->set_session_id(id);
  s->set_rank(rank);
  s->set_pid(static_cast<uint32_t>(1000 + rank));
  s->set_label(label);
  s->set_group(group);
  s->set_mode(v1::MODE_MAPPED);
  return s;
}

void AddMember(v1::GroupStats* g, const std::string& id, int64_t rank, uint64_t device,
               uint64_t peer, uint64_t host) {
  v1::GroupMemberStats* m = g->add_member_rows();
  m->set_session_id(id);
  m->set_rank(rank);
  m->set_device_pages(device);
  m->set_peer_pages(peer);
  m->set_host_pages(host);
}

// Two tiers, two ranks of job "llama" in one group holding 4 gpu0 chunks and 1 host chunk
// (64 pages each: 320 pages of 256 KiB = 80 MiB), and one session in no group.
v1::GetStatsResponse SampleStats() {
  v1::GetStatsResponse stats;
  stats.mutable_daemon()->set_version("9.9.9");
  AddTier(&stats, "gpu0", 0);
  AddTier(&stats, "host", -1);
  AddSession(&stats, "aaaaaaaa00000000aaaaaaaa00000000", 0, "llama-0", "llama");
  AddSession(&stats, "bbbbbbbb00000000bbbbbbbb00000000", 1, "llama-1", "llama");
  AddSession(&stats, "cccccccc00000000cccccccc00000000", 2, "other", "");
  v1::GroupStats* g = stats.add_groups();
  g->set_name("llama");
  g->set_group_id(7);
  g->set_uid(1000);
  g->set_members(2);
  v1::GroupTierStats* gpu = g->add_tiers();
  gpu->set_tier("gpu0");
  gpu->set_chunks(4);
  gpu->set_pages(256);
  gpu->set_pages_claimed(200);
  v1::GroupTierStats* host = g->add_tiers();
  host->set_tier("host");
  host->set_chunks(1);
  host->set_pages(64);
  host->set_pages_claimed(10);
  g->set_pages_claimed(210);
  g->set_pages_claimed_high_water(300);
  g->set_depot_misses(3);
  g->set_depot_missed_pages(48);
  g->set_chunks_leaving(1);
  // The daemon's order is its own; --detail lists members by rank.
  AddMember(g, "bbbbbbbb00000000bbbbbbbb00000000", 1, 80, 0, 0);
  AddMember(g, "aaaaaaaa00000000aaaaaaaa00000000", 0, 120, 0, 10);
  return stats;
}

TEST(StashctlGroups, NoGroupTableWhenTheDaemonReportsNone) {
  v1::GetStatsResponse stats = SampleStats();
  stats.clear_groups();
  EXPECT_EQ(RenderGroups(stats), "");
  EXPECT_EQ(RenderSessionsAndGroups(stats), RenderSessions(stats.sessions()));
  EXPECT_EQ(RenderSessionsAndGroups(stats, /*detail=*/true),
            RenderSessions(stats.sessions(), 0, /*detail=*/true));
  EXPECT_EQ(RenderStats(stats).find("MEMBERS"), std::string::npos);
}

TEST(StashctlGroups, SessionsShowOneRowPerGroupAfterTheSessionTable) {
  const v1::GetStatsResponse stats = SampleStats();
  const std::string text = RenderSessionsAndGroups(stats);
  EXPECT_EQ(text.rfind(RenderSessions(stats.sessions()) + "\n", 0), 0u) << text;
  EXPECT_NE(text.find("\nGROUP   UID  MEMBERS  CHUNK BYTES  CLAIMED/HIGH WATER PAGES  DEPOT MISSES"
                      "  MISSED PAGES  LEAVING CHUNKS\n"
                      "llama  1000        2       80 MiB                   210/300             3"
                      "            48               1\n"),
            std::string::npos)
      << text;
  // Without --detail, no per-tier or per-member rows.
  EXPECT_EQ(text.find("chunks by tier"), std::string::npos) << text;
}

TEST(StashctlGroups, StatsShowTheGroupTableToo) {
  const std::string text = RenderStats(SampleStats());
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(\nllama +1000 +2 +80 MiB +210/300 )"))) << text;
  EXPECT_EQ(text.find("chunks by tier"), std::string::npos) << text;
}

TEST(StashctlGroups, DetailShowsChunksByTierAndEachMembersPagesByKind) {
  const std::string text = RenderSessionsAndGroups(SampleStats(), /*detail=*/true);
  EXPECT_NE(text.find("\ngroup llama (uid 1000, id 7): chunks by tier\n"
                      "TIER  CHUNKS  CLAIMED/TOTAL PAGES  CHUNK BYTES\n"
                      "gpu0       4              200/256       64 MiB\n"
                      "host       1                10/64       16 MiB\n"
                      "members' claimed pages by kind\n"
                      "SESSION   RANK  DEVICE PAGES  PEER PAGES  HOST PAGES\n"
                      "aaaaaaaa     0           120           0          10\n"
                      "bbbbbbbb     1            80           0           0\n"),
            std::string::npos)
      << text;
  // The sessions' own details come first, the groups' after the groups table.
  EXPECT_LT(text.find("session aaaaaaaa"), text.find("\nGROUP   UID"));
  EXPECT_LT(text.find("\nGROUP   UID"), text.find("group llama (uid"));
}

TEST(StashctlGroups, AGroupWhoseMembersSessionsEndedStillShows) {
  v1::GetStatsResponse stats = SampleStats();
  stats.clear_sessions();
  const std::string text = RenderSessionsAndGroups(stats);
  EXPECT_EQ(text.rfind("no sessions connected\n\nGROUP", 0), 0u) << text;
}

TEST(StashctlGroups, HoldingsFallBackToPagesWhenATiersPageSizeIsUnknown) {
  v1::GetStatsResponse stats = SampleStats();
  stats.mutable_groups(0)->mutable_tiers(1)->set_tier("host7");
  const std::string text = RenderSessionsAndGroups(stats, /*detail=*/true);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(\nllama +1000 +2 +320 pages +210/300 )")))
      << text;
  EXPECT_NE(text.find("host7       1                10/64            -\n"), std::string::npos)
      << text;
}

TEST(StashctlGroups, ControlCharactersInANameCannotMoveTheCursor) {
  v1::GetStatsResponse stats = SampleStats();
  stats.mutable_groups(0)->set_name("a\033[2Jb");
  const std::string text = RenderGroups(stats);
  EXPECT_EQ(text.find('\033'), std::string::npos) << text;
  EXPECT_NE(text.find("a?[2Jb"), std::string::npos) << text;
}

TEST(StashctlGroups, ANarrowTerminalCutsTheNameAndDropsTheLeastTellingColumns) {
  v1::GetStatsResponse stats = SampleStats();
  stats.mutable_groups(0)->set_name("torchrun:0123456789abcdef@10.0.0.1:29500");
  const std::string text = RenderGroups(stats, /*detail=*/false, /*width=*/60);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 60u) << text;
  EXPECT_NE(text.find("torchrun:01~"), std::string::npos) << text;
  EXPECT_NE(text.find("MEMBERS"), std::string::npos) << text;
  EXPECT_NE(text.find("CHUNK BYTES"), std::string::npos) << text;
  EXPECT_EQ(text.find("MISSED PAGES"), std::string::npos) << text;
}

// `stashctl sessions --label=...` (or --rank, --pid) shows the groups of the sessions it shows.
TEST(StashctlGroups, ASessionFilterKeepsTheGroupsOfTheSessionsItShows) {
  v1::GetStatsResponse stats = SampleStats();
  SessionSelection other;
  other.label = "other";
  SelectSessions(other, stats.mutable_sessions());
  SelectGroups(other, stats.sessions(), stats.mutable_groups());
  EXPECT_EQ(stats.groups_size(), 0);

  stats = SampleStats();
  SessionSelection rank1;
  rank1.rank = 1;
  SelectSessions(rank1, stats.mutable_sessions());
  SelectGroups(rank1, stats.sessions(), stats.mutable_groups());
  ASSERT_EQ(stats.groups_size(), 1);
  EXPECT_EQ(stats.groups(0).member_rows_size(), 2);  // every member row stays

  stats = SampleStats();
  SessionSelection sort_only;
  sort_only.sort = "held";
  stats.clear_sessions();
  SelectGroups(sort_only, stats.sessions(), stats.mutable_groups());
  EXPECT_EQ(stats.groups_size(), 1);  // a sort chooses no sessions
}

// --json prints the reply with these options (stashctl.cc ToJson): groups with their tiers and
// member rows, under proto field names, zeros included.
TEST(StashctlGroups, JsonHasEveryGroupFieldUnderItsProtoName) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(SampleStats(), &json, options).ok());
  const std::string fields[] = {
      R"("groups":[{"name":"llama","group_id":"7","uid":1000,"members":2,)",
      R"("tier":"gpu0","chunks":"4","pages":"256","pages_claimed":"200")",
      R"("pages_claimed_high_water":"300")",
      R"("depot_misses":"3")",
      R"("depot_missed_pages":"48")",
      R"("chunks_leaving":"1")",
      R"("member_rows":[{"session_id":"bbbbbbbb00000000bbbbbbbb00000000","rank":"1",)",
      R"("rank":"1","device_pages":"80","peer_pages":"0","host_pages":"0"})",
  };
  for (const std::string& field : fields) {
    EXPECT_NE(json.find(field), std::string::npos) << field << "\n" << json;
  }
}

}  // namespace
}  // namespace stash::stashctl

// DaemonCore without its transport: the stats responses stay bounded whatever clients send.
#include "daemon/core/core.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

std::unique_ptr<DaemonCore> SmallCore() {
  DaemonConfig config;
  config.pool_bytes = 1 << 20;
  config.page_bytes = 64 << 10;
  config.host_tier_bytes = 0;
  EXPECT_TRUE(ValidateConfig(config).ok());
  auto core = DaemonCore::Create(config, v1::BACKEND_HOST, "/nonexistent/stashd.sock");
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return std::move(core).value();
}

// Many sessions with the longest labels allowed: GetStats and ListSessions carry at most
// kMaxSessionRows rows, say how many they left out, and stay far below gRPC's 4 MiB limit.
TEST(DaemonCore, StatsStayBoundedHoweverManySessionsThereAre) {
  auto core = SmallCore();
  const size_t sessions = kMaxSessionRows + 6;
  std::vector<std::shared_ptr<Session>> open;
  for (size_t i = 0; i < sessions; ++i) {
    v1::Hello hello;
    hello.set_backend(v1::BACKEND_HOST);
    hello.set_rank(static_cast<int64_t>(i));
    hello.set_label(std::string(kMaxTextBytes, 'l'));
    hello.set_client_version(std::string(kMaxTextBytes, 'v'));
    v1::Welcome welcome;
    auto session = core->OpenSession(hello, nullptr, &welcome);
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    open.push_back(*session);
  }
  const v1::GetStatsResponse stats = core->Stats();
  EXPECT_EQ(stats.daemon().sessions_live(), sessions);
  EXPECT_EQ(static_cast<size_t>(stats.sessions_size()), kMaxSessionRows);
  EXPECT_EQ(stats.sessions_omitted(), 6u);
  EXPECT_EQ(stats.sessions(0).rank(), 0);  // by rank: the first ones are kept
  EXPECT_LT(stats.ByteSizeLong(), 1u << 20);
  const v1::ListSessionsResponse listed = core->ListSessions();
  EXPECT_EQ(static_cast<size_t>(listed.sessions_size()), kMaxSessionRows);
  EXPECT_EQ(listed.sessions_omitted(), 6u);

  // Node-level numbers only (the TCP listener): no rows at all.
  const v1::GetStatsResponse anonymous = core->Stats(/*session_rows=*/false);
  EXPECT_EQ(anonymous.sessions_size(), 0);
  EXPECT_EQ(anonymous.sessions_omitted(), sessions);
  EXPECT_EQ(anonymous.daemon().sessions_live(), sessions);
  for (auto& s : open) core->CloseSession(s);
  core->Stop();
}

v1::Hello GroupHello(const std::string& group, const std::string& secret) {
  v1::Hello hello;
  hello.set_backend(v1::BACKEND_HOST);
  hello.set_group(group);
  hello.set_group_secret(secret);
  return hello;
}

PeerCredentials Peer(uint32_t uid) {
  PeerCredentials peer;
  peer.pid = 4242;
  peer.uid = uid;
  peer.known = true;
  return peer;
}

// Issue 41: OpenSession joins the Hello's group with the peer's uid; a refused join makes no
// session and takes nothing; CloseSession leaves the group; the session row names the group.
TEST(DaemonCore, SessionsJoinTheirHellosGroupByUidAndSecret) {
  auto core = SmallCore();
  const std::string secret(32, 's');
  v1::Welcome welcome;
  auto first = core->OpenSession(GroupHello("job", secret), nullptr, &welcome, Peer(1000));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->info().group, "job");
  EXPECT_GT((*first)->info().group_id, 0u);
  auto second = core->OpenSession(GroupHello("job", secret), nullptr, &welcome, Peer(1000));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*second)->info().group_id, (*first)->info().group_id);

  auto wrong =
      core->OpenSession(GroupHello("job", std::string(32, 'x')), nullptr, &welcome, Peer(1000));
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  auto other_user = core->OpenSession(GroupHello("job", secret), nullptr, &welcome, Peer(1001));
  EXPECT_EQ(other_user.status().code(), StatusCode::kPermissionDenied);
  auto bad_name = core->OpenSession(GroupHello("a b", secret), nullptr, &welcome, Peer(1000));
  EXPECT_EQ(bad_name.status().code(), StatusCode::kInvalidArgument);
  auto no_secret = core->OpenSession(GroupHello("job", ""), nullptr, &welcome, Peer(1000));
  EXPECT_EQ(no_secret.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core->SessionsLive(), 2u);  // the refused ones made no session
  EXPECT_EQ(core->groups().members("job"), 2u);

  // A session in no group is as before, and its row names no group.
  auto plain = core->OpenSession(GroupHello("", ""), nullptr, &welcome, Peer(1001));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*plain)->info().group_id, 0u);
  const v1::ListSessionsResponse listed = core->ListSessions();
  ASSERT_EQ(listed.sessions_size(), 3);
  int in_group = 0;
  for (const v1::SessionStats& row : listed.sessions()) {
    if (row.session_id() == (*plain)->info().id) {
      EXPECT_FALSE(row.has_group());
    } else {
      EXPECT_EQ(row.group(), "job");
      ++in_group;
    }
  }
  EXPECT_EQ(in_group, 2);

  // The group goes with its last session; the name is free again, for anyone.
  const uint64_t old_id = (*first)->info().group_id;
  core->CloseSession(*first);
  core->CloseSession(*second);
  EXPECT_EQ(core->groups().groups(), 0u);
  auto again =
      core->OpenSession(GroupHello("job", std::string(32, 'x')), nullptr, &welcome, Peer(1001));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE((*again)->info().group_id, old_id);
  core->CloseSession(*again);
  core->CloseSession(*plain);
  core->Stop();
}

}  // namespace
}  // namespace stash::daemon

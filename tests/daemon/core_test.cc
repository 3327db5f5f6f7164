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

}  // namespace
}  // namespace stash::daemon

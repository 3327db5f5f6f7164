// GetStats against a running stashd, for the integration tests that check what it reports.
#ifndef STASH_TESTS_INTEGRATION_DAEMON_STATS_H_
#define STASH_TESTS_INTEGRATION_DAEMON_STATS_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "stash/v1/stash.grpc.pb.h"

namespace stash::testing {

// The daemon's GetStats answer on `socket` (a failed call is a test failure and an empty answer).
inline stash::v1::GetStatsResponse DaemonStats(const std::string& socket) {
  auto stub = stash::v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  stash::v1::GetStatsResponse r;
  const grpc::Status s = stub->GetStats(&ctx, stash::v1::GetStatsRequest(), &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r;
}

// stashctl drain (undrain = false) or undrain over the RPC on `socket`: whether it drains now.
inline bool DrainDaemon(const std::string& socket, bool undrain) {
  auto stub = stash::v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  stash::v1::DrainRequest request;
  request.set_undrain(undrain);
  stash::v1::DrainResponse r;
  const grpc::Status s = stub->Drain(&ctx, request, &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r.draining();
}

// Pages in use over every tier.
inline uint64_t PagesUsed(const stash::v1::GetStatsResponse& r) {
  uint64_t used = 0;
  for (const auto& t : r.tiers()) used += t.pages_used();
  return used;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_INTEGRATION_DAEMON_STATS_H_

// Parsing client bytes (daemon/protocol/wire.cc): a malformed request is refused with what is
// wrong.
#include "daemon/protocol/wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "stash/v1/stash.pb.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;
using ::testing::Not;

std::string HelloBytes(const std::string& label = "job-7") {
  v1::SessionRequest r;
  r.set_request_id(1);
  r.mutable_hello()->set_backend(v1::BACKEND_HOST);
  r.mutable_hello()->set_label(label);
  r.mutable_hello()->set_client_version("0.1.0");
  return r.SerializeAsString();
}

TEST(Wire, AValidRequestParses) {
  v1::SessionRequest r;
  ASSERT_TRUE(ParseMessage(HelloBytes(), &r).ok());
  EXPECT_EQ(r.hello().label(), "job-7");
  EXPECT_TRUE(ParseMessage("", &r).ok());  // all fields default
  EXPECT_FALSE(r.has_hello());
}

TEST(Wire, TruncatedMessageSaysWhereItEnds) {
  const std::string bytes = HelloBytes();
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    v1::SessionRequest r;
    const Status s = ParseMessage(bytes.substr(0, cut), &r);
    // A cut between two top-level fields leaves a valid (shorter) message.
    if (s.ok()) continue;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << cut;
    EXPECT_THAT(s.message(), HasSubstr("not a valid stash.v1.SessionRequest: truncated")) << cut;
  }
  v1::SessionRequest r;
  const Status s = ParseMessage(bytes.substr(0, bytes.size() - 1), &r);
  EXPECT_THAT(s.message(), HasSubstr("field stash.v1.SessionRequest.hello says"));
}

TEST(Wire, InvalidUtf8InAStringFieldIsNamed) {
  v1::SessionRequest r;
  Status s = ParseMessage(HelloBytes("job-\xff\xfe"), &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field stash.v1.Hello.label is not valid UTF-8"));
  EXPECT_THAT(s.message(), Not(HasSubstr("job-")));

  v1::SessionRequest stash;
  stash.set_request_id(2);
  stash.mutable_stash()->set_name("layer\xc0\xaf");
  s = ParseMessage(stash.SerializeAsString(), &r);
  EXPECT_THAT(s.message(), HasSubstr("field stash.v1.Stash.name is not valid UTF-8"));
}

TEST(Wire, LengthRunningPastTheEndIsTruncated) {
  // Field 2 (hello), length 100, then 3 bytes.
  const std::string bytes = std::string("\x12\x64", 2) + "abc";
  v1::SessionRequest r;
  const Status s = ParseMessage(bytes, &r);
  EXPECT_THAT(s.message(), HasSubstr("says 100 bytes but only 3 are left"));
}

TEST(Wire, DeeplyNestedUnknownGroupsAreRefused) {
  std::string bytes;
  for (int i = 0; i < 200; ++i) bytes += '\x4b';  // start group, field 9 (unknown)
  for (int i = 0; i < 200; ++i) bytes += '\x4c';  // end group, field 9
  v1::SessionRequest r;
  const Status s = ParseMessage(bytes, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nested deeper than 100"));
  // A few levels are fine: unknown fields are kept or skipped, as protobuf does.
  EXPECT_TRUE(ParseMessage(std::string(3, '\x4b') + std::string(3, '\x4c'), &r).ok());
}

TEST(Wire, NonexistentWireTypeAndStrayEndGroupAreRefused) {
  v1::SessionRequest r;
  EXPECT_THAT(ParseMessage("\x0f", &r).message(), HasSubstr("wire type 7"));
  EXPECT_THAT(ParseMessage("\x4c", &r).message(), HasSubstr("closes no group"));
  EXPECT_THAT(ParseMessage(std::string("\x00", 1), &r).message(), HasSubstr("field number 0"));
}

TEST(Wire, RandomBytesNeverParseSilentlyWrong) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    v1::SessionRequest mine;
    const Status s = ParseMessage(bytes, &mine);
    v1::SessionRequest theirs;
    const bool protobuf_ok = theirs.ParseFromString(bytes);
    // Whatever protobuf accepts, we accept with the same result; the rest has a reason.
    if (protobuf_ok) {
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(mine.SerializeAsString(), theirs.SerializeAsString());
    } else {
      ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(s.message(), HasSubstr("not a valid stash.v1.SessionRequest"));
    }
  }
}

}  // namespace
}  // namespace stash::daemon

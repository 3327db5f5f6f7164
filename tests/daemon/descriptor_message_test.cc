// Parsing of descriptor-channel packets (daemon/protocol/descriptor_message.h).
#include "daemon/protocol/descriptor_message.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using ::testing::HasSubstr;
using ::testing::Not;

v1::DescriptorRequest Valid() {
  v1::DescriptorRequest r;
  r.set_session_id(std::string(32, 'a'));
  r.set_session_secret(std::string(32, '\x01'));
  r.mutable_deposit_memory()->set_memory_id(7);
  r.mutable_deposit_memory()->set_bytes(4096);
  return r;
}

void ExpectRefused(const std::string& bytes, size_t fds, const std::string& why) {
  auto parsed = ParseDescriptorRequest(bytes, fds);
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << parsed.status().ToString();
  EXPECT_THAT(parsed.status().message(), HasSubstr(why));
}

TEST(DescriptorMessage, AValidDepositParses) {
  auto parsed = ParseDescriptorRequest(Valid().SerializeAsString(), 1);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->deposit_memory().memory_id(), 7U);
}

TEST(DescriptorMessage, GarbageIsRefusedWithoutEchoingIt) {
  const std::string garbage = "\xff\xff\xff\xffsecret-looking-bytes";
  auto parsed = ParseDescriptorRequest(garbage, 1);
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), Not(HasSubstr("secret-looking")));
}

TEST(DescriptorMessage, TheSessionAndSecretMustHaveTheirShape) {
  v1::DescriptorRequest r = Valid();
  r.set_session_id("short");
  ExpectRefused(r.SerializeAsString(), 1, "session_id");
  r = Valid();
  r.set_session_id(std::string(32, 'Z'));
  ExpectRefused(r.SerializeAsString(), 1, "hex");
  r = Valid();
  r.set_session_secret("x");
  ExpectRefused(r.SerializeAsString(), 1, "session_secret");
}

TEST(DescriptorMessage, ADepositCarriesExactlyOneDescriptor) {
  ExpectRefused(Valid().SerializeAsString(), 0, "carried 0");
  ExpectRefused(Valid().SerializeAsString(), 2, "carried 2");
}

TEST(DescriptorMessage, ZeroIdsAndSizesAndMissingKindsAreRefused) {
  v1::DescriptorRequest r = Valid();
  r.mutable_deposit_memory()->set_memory_id(0);
  ExpectRefused(r.SerializeAsString(), 1, "memory_id");
  r = Valid();
  r.mutable_deposit_memory()->set_bytes(0);
  ExpectRefused(r.SerializeAsString(), 1, "bytes");
  r = Valid();
  r.clear_deposit_memory();
  ExpectRefused(r.SerializeAsString(), 0, "deposit_memory");
}

TEST(DescriptorMessage, AnswersAreBoundedAndValidUtf8) {
  v1::DescriptorResponse response;
  ASSERT_TRUE(response.ParseFromString(
      DescriptorAnswer(InvalidArgumentError("bad \xff\xfe bytes " + std::string(5000, 'x')))));
  EXPECT_EQ(response.code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_LE(response.message().size(), 1024U);
  EXPECT_THAT(response.message(), HasSubstr("bad ?? bytes"));
}

// Found by descriptor_message_fuzzer: sequences that look like UTF-8 but are not well-formed.
TEST(DescriptorMessage, AnswersReplaceOverlongSurrogateAndOutOfRangeSequences) {
  v1::DescriptorResponse response;
  ASSERT_TRUE(response.ParseFromString(
      DescriptorAnswer(InternalError("a\xc1\xa5 b\xed\xa0\x80 c\xf4\x90\x80\x80 d\xc3\xa9"), 7)));
  EXPECT_EQ(response.message(), "a?? b??? c???? d\xc3\xa9");
  EXPECT_EQ(response.memory_id(), 7U);
}

}  // namespace
}  // namespace stash::daemon

namespace stash::daemon {
namespace {

v1::DescriptorRequest Lease() {
  v1::DescriptorRequest r;
  r.set_session_id(std::string(32, 'a'));
  r.set_session_secret(std::string(32, '\x01'));
  r.mutable_lease_chunks();
  return r;
}

TEST(DescriptorMessage, LeaseChunksNamesEachLeaseTierAtMostOnceAndCarriesNoDescriptor) {
  v1::DescriptorRequest r = Lease();
  v1::TierPages* w = r.mutable_lease_chunks()->add_want();
  w->set_tier(v1::TIER_DEVICE);
  w->set_pages(8);
  EXPECT_TRUE(ParseDescriptorRequest(r.SerializeAsString(), 0).ok());
  ExpectRefused(r.SerializeAsString(), 1, "carries no descriptor");
  *r.mutable_lease_chunks()->add_want() = *w;
  ExpectRefused(r.SerializeAsString(), 0, "twice");
  v1::DescriptorRequest bad = Lease();
  bad.mutable_lease_chunks()->add_want()->set_tier(v1::TIER_OVERFLOW);
  ExpectRefused(bad.SerializeAsString(), 0, "TIER_DEVICE, TIER_PEER or TIER_HOST");
  v1::DescriptorRequest odd = Lease();
  odd.mutable_lease_chunks()->add_want()->set_tier(static_cast<v1::Tier>(1 << 20));
  ExpectRefused(odd.SerializeAsString(), 0, "TIER_DEVICE, TIER_PEER or TIER_HOST");
  v1::DescriptorRequest both = Lease();
  both.mutable_lease_chunks()->set_automatic(true);
  both.mutable_lease_chunks()->add_want()->set_tier(v1::TIER_HOST);
  ExpectRefused(both.SerializeAsString(), 0, "not both");
}

TEST(DescriptorMessage, ReturnChunksNamesDistinctIdsWithinTheLimit) {
  v1::DescriptorRequest r = Lease();
  r.mutable_return_chunks();
  ExpectRefused(r.SerializeAsString(), 0, "name 1 to");
  r.mutable_return_chunks()->add_chunk_ids(5);
  r.mutable_return_chunks()->add_chunk_ids(~uint64_t{0});
  EXPECT_TRUE(ParseDescriptorRequest(r.SerializeAsString(), 0).ok());
  ExpectRefused(r.SerializeAsString(), 2, "carries no descriptor");
  r.mutable_return_chunks()->add_chunk_ids(5);
  ExpectRefused(r.SerializeAsString(), 0, "twice");
  v1::DescriptorRequest many = Lease();
  for (uint64_t i = 0; i <= kMaxReturnChunkIds; ++i) many.mutable_return_chunks()->add_chunk_ids(i);
  ExpectRefused(many.SerializeAsString(), 0, "name 1 to");
}

}  // namespace
}  // namespace stash::daemon

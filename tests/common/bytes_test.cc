// ParseBytes / FormatBytes (common/bytes.h): the size syntax every size knob goes through.
#include "common/bytes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace stash {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1ULL << 10;
constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kGiB = 1ULL << 30;
constexpr uint64_t kTiB = 1ULL << 40;

uint64_t ParseOk(const std::string& text) {
  auto parsed = ParseBytes(text);
  EXPECT_TRUE(parsed.ok()) << "'" << text << "': " << parsed.status().ToString();
  return parsed.ok() ? *parsed : 0;
}

TEST(ParseBytes, BareNumberIsBytes) {
  EXPECT_EQ(ParseOk("0"), 0u);
  EXPECT_EQ(ParseOk("1"), 1u);
  EXPECT_EQ(ParseOk("4096"), 4096u);
  EXPECT_EQ(ParseOk("1073741824"), kGiB);
  EXPECT_EQ(ParseOk("512B"), 512u);
}

TEST(ParseBytes, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(ParseOk("256KiB"), 256 * kKiB);
  EXPECT_EQ(ParseOk("512MiB"), 512 * kMiB);
  EXPECT_EQ(ParseOk("64GiB"), 64 * kGiB);
  EXPECT_EQ(ParseOk("2TiB"), 2 * kTiB);
}

TEST(ParseBytes, SingleLetterShorthandsAreBinary) {
  EXPECT_EQ(ParseOk("4K"), 4 * kKiB);
  EXPECT_EQ(ParseOk("4M"), 4 * kMiB);
  EXPECT_EQ(ParseOk("4G"), 4 * kGiB);
  EXPECT_EQ(ParseOk("4T"), 4 * kTiB);
}

TEST(ParseBytes, DecimalUnitsArePowersOf1000) {
  EXPECT_EQ(ParseOk("1KB"), 1000u);
  EXPECT_EQ(ParseOk("1MB"), 1000u * 1000);
  EXPECT_EQ(ParseOk("1GB"), 1000ULL * 1000 * 1000);
  EXPECT_EQ(ParseOk("1TB"), 1000ULL * 1000 * 1000 * 1000);
}

TEST(ParseBytes, UnitsAreCaseInsensitive) {
  EXPECT_EQ(ParseOk("64gib"), 64 * kGiB);
  EXPECT_EQ(ParseOk("64GIB"), 64 * kGiB);
  EXPECT_EQ(ParseOk("3kb"), 3000u);
  EXPECT_EQ(ParseOk("7b"), 7u);
}

TEST(ParseBytes, SurroundingSpaceAndSpaceBeforeUnitAreAccepted) {
  EXPECT_EQ(ParseOk(" 64MiB "), 64 * kMiB);
  EXPECT_EQ(ParseOk("64 MiB"), 64 * kMiB);
}

TEST(ParseBytes, FractionIsExactWhenItMakesWholeBytes) {
  EXPECT_EQ(ParseOk("1.5GiB"), kGiB + kGiB / 2);
  EXPECT_EQ(ParseOk("0.5KiB"), 512u);
  EXPECT_EQ(ParseOk("2.25MiB"), 2 * kMiB + kMiB / 4);
  EXPECT_EQ(ParseOk("1.5KB"), 1500u);
}

TEST(ParseBytes, FractionOfAByteIsRejected) {
  for (const char* text : {"1.5", "0.5B", "1.0001KiB", "1.3KiB"}) {
    auto parsed = ParseBytes(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("whole number of bytes")) << text;
  }
}

TEST(ParseBytes, LargestValueFitsAndOneMoreIsRejected) {
  EXPECT_EQ(ParseOk("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ParseOk("16777215TiB"), 16777215ULL * kTiB);
  for (const char* text : {"18446744073709551616", "16777216TiB", "99999999999999999999GiB"}) {
    auto parsed = ParseBytes(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("too large")) << text;
  }
}

TEST(ParseBytes, MalformedTextIsInvalidArgumentShowingTheTextAndTheAcceptedForms) {
  for (const char* text : {"", "   ", "12XB", "-1", "GiB", "abc", "1..5GiB", "1.5.5", "1 2", "+4",
                           "4 PiB", "0x10", "1e9"}) {
    auto parsed = ParseBytes(text);
    ASSERT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << *parsed;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("'" + std::string(text) + "'"));
    EXPECT_THAT(parsed.status().message(), HasSubstr("KiB")) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("e.g. 512MiB")) << text;
  }
}

TEST(ParseBytes, UnknownUnitIsNamed) {
  auto parsed = ParseBytes("12XB");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("unknown unit 'XB'"));
}

TEST(FormatBytes, SmallValuesAreWholeBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1), "1 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

TEST(FormatBytes, PicksTheLargestBinaryUnitAtLeastOne) {
  EXPECT_EQ(FormatBytes(kKiB), "1 KiB");
  EXPECT_EQ(FormatBytes(256 * kKiB), "256 KiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512 MiB");
  EXPECT_EQ(FormatBytes(64 * kGiB), "64 GiB");
  EXPECT_EQ(FormatBytes(3 * kTiB), "3 TiB");
  EXPECT_EQ(FormatBytes(kTiB * 1024), "1 PiB");
}

TEST(FormatBytes, KeepsAtMostTwoDecimalsWithoutTrailingZeros) {
  EXPECT_EQ(FormatBytes(kGiB + kGiB / 2), "1.5 GiB");
  EXPECT_EQ(FormatBytes(kGiB + kGiB / 4), "1.25 GiB");
  EXPECT_EQ(FormatBytes(kKiB + 1), "1 KiB");  // 1.0009765625 rounds to 1.00
  EXPECT_EQ(FormatBytes(1537), "1.5 KiB");    // 1.5009765625 rounds to 1.50
  EXPECT_EQ(FormatBytes(std::numeric_limits<uint64_t>::max()), "16384 PiB");
}

TEST(FormatBytes, ExactValuesRoundTripThroughParseBytes) {
  for (uint64_t bytes : {uint64_t{0}, uint64_t{512}, kKiB, 256 * kKiB, kGiB + kGiB / 2, 64 * kGiB,
                         kTiB + kTiB / 4}) {
    const std::string text = FormatBytes(bytes);
    EXPECT_EQ(ParseOk(text), bytes) << text;
  }
}

}  // namespace
}  // namespace stash

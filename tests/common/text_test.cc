// Text helpers (common/text.h).
#include "common/text.h"

#include <gtest/gtest.h>

#include <string>

namespace stash {
namespace {

TEST(IsValidUtf8, AcceptsAsciiAndEveryEncodingLength) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("/stashd-4242-00ff"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));           // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));          // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));      // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF, the last code point
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));  // NUL is a code point
}

TEST(IsValidUtf8, RejectsStrayAndTruncatedBytes) {
  EXPECT_FALSE(IsValidUtf8("\x80"));          // continuation without a lead
  EXPECT_FALSE(IsValidUtf8("\xff"));          // never in UTF-8
  EXPECT_FALSE(IsValidUtf8("caf\xc3"));       // cut short at the end
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));      // cut short at the end
  EXPECT_FALSE(IsValidUtf8("\xe2\x28\xa1"));  // a lead followed by ASCII
}

TEST(IsValidUtf8, RejectsOverlongSurrogatesAndBeyondTheLastCodePoint) {
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // '/' in two bytes
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // '/' in three bytes
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // U+D800, a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // U+110000
}

}  // namespace
}  // namespace stash

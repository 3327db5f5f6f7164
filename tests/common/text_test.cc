// Text helpers (common/text.cc): what a client sent becomes valid, printable UTF-8 in messages.
#include "common/text.h"

#include <gtest/gtest.h>

#include <string>

namespace stash {
namespace {

TEST(Text, IsUtf8AcceptsAsciiAndEveryEncodingLength) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("/stashd-4242-00ff"));
  EXPECT_TRUE(IsUtf8("caf\xc3\xa9"));           // U+00E9
  EXPECT_TRUE(IsUtf8("\xe2\x82\xac"));          // U+20AC
  EXPECT_TRUE(IsUtf8("\xf0\x9f\x98\x80"));      // U+1F600
  EXPECT_TRUE(IsUtf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF, the last code point
  EXPECT_TRUE(IsUtf8(std::string("a\0b", 3)));  // NUL is a code point
}

TEST(Text, IsUtf8RejectsStrayAndTruncatedBytes) {
  EXPECT_FALSE(IsUtf8("\x80"));          // continuation without a lead
  EXPECT_FALSE(IsUtf8("\xff"));          // never in UTF-8
  EXPECT_FALSE(IsUtf8("caf\xc3"));       // cut short at the end
  EXPECT_FALSE(IsUtf8("\xe2\x82"));      // cut short at the end
  EXPECT_FALSE(IsUtf8("\xe2\x28\xa1"));  // a lead followed by ASCII
}

TEST(Text, IsUtf8RejectsOverlongSurrogatesAndBeyondTheLastCodePoint) {
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));          // '/' in two bytes
  EXPECT_FALSE(IsUtf8("\xe0\x80\xaf"));      // '/' in three bytes
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // U+D800, a surrogate
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // U+110000
}

TEST(Text, IsUtf8AcceptsWellFormedText) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("plain ascii"));
  EXPECT_TRUE(
      IsUtf8("gr\xc3\xbc\xc3\x9f"
             "e \xe2\x82\xac \xf0\x9f\x98\x80"));  // ü ß € 😀
}

TEST(Text, IsUtf8RejectsWhatProto3Rejects) {
  EXPECT_FALSE(IsUtf8("/stashd-\xff\xfe\xfd"));
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsUtf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(IsUtf8("\x80"));              // a lone continuation byte
}

TEST(Text, EscapedKeepsPrintableUtf8AndEscapesTheRest) {
  EXPECT_EQ(Escaped("/stashd-1-ab"), "/stashd-1-ab");
  EXPECT_EQ(Escaped("/stashd-\xff\xfe\xfd"), "/stashd-\\xff\\xfe\\xfd");
  EXPECT_EQ(Escaped(std::string("a\0b\n\\", 5)), "a\\x00b\\x0a\\x5c");
  EXPECT_EQ(Escaped("\xe2\x82\xac"), "\xe2\x82\xac");
  EXPECT_TRUE(IsUtf8(Escaped("\xc0\xaf\xed\xa0\x80")));
}

TEST(Text, EscapedShowsOnlyAPrefixOfLongInput) {
  const std::string big(4 << 20, 'x');
  const std::string shown = Escaped(big, 16);
  EXPECT_EQ(shown, std::string(16, 'x') + "...(4194304 bytes)");
}

TEST(Text, ValidUtf8LeavesGoodTextAloneAndEscapesBadBytes) {
  EXPECT_EQ(ValidUtf8("cannot open memory 7: \xe2\x82\xac"), "cannot open memory 7: \xe2\x82\xac");
  EXPECT_EQ(ValidUtf8("name '/x\xff'"), "name '/x\\xff'");
  EXPECT_TRUE(IsUtf8(ValidUtf8("\xf0\x9f\x98")));
}

}  // namespace
}  // namespace stash

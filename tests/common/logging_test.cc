#include "common/logging.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace stash {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Runs `log` with stderr captured and the format set, and returns the lines it wrote.
template <typename F>
std::vector<std::string> Captured(LogFormat format, F log) {
  SetLogFormat(format);
  testing::internal::CaptureStderr();
  log();
  Log("test")->flush();
  std::fflush(stderr);
  const std::string text = testing::internal::GetCapturedStderr();
  SetLogFormat(LogFormat::kText);
  return Lines(text);
}

TEST(LogFields, JsonLinesCarryTheFieldsAsKeys) {
  const auto lines = Captured(LogFormat::kJson, [] {
    LogFields fields;
    fields.Add("session", "0123abcd").Add("rank", 3).Add("pid", 4242).Add("name", "exp\"1\"");
    fields.Add("layer", 7).Add("microbatch", 2);
    Log("test")->warn("overflow: no room");
  });
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_EQ(line.front(), '{');
  EXPECT_NE(
      line.find(R"("logger":"stashd.test","message":"overflow: no room","session":"0123abcd",)"
                R"("rank":3,"pid":4242,"name":"exp\"1\"","layer":7,"microbatch":2})"),
      std::string::npos)
      << line;
}

TEST(LogFields, ScopesNestAndEndWithTheirBlock) {
  const auto lines = Captured(LogFormat::kJson, [] {
    LogFields outer;
    outer.Add("session", "s1");
    {
      LogFields inner;
      inner.Add("layer", 1);
      Log("test")->info("inner");
    }
    Log("test")->info("outer");
  });
  Log("test")->info("none");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find(R"("message":"inner","session":"s1","layer":1})"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find(R"("message":"outer","session":"s1"})"), std::string::npos) << lines[1];
  const auto after = Captured(LogFormat::kJson, [] { Log("test")->info("none"); });
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after[0].find(R"("message":"none"})"), std::string::npos) << after[0];
}

TEST(LogFields, TextLinesAreUnchanged) {
  const auto lines = Captured(LogFormat::kText, [] {
    LogFields fields;
    fields.Add("rank", 3);
    Log("test")->warn("said in words: rank 3");
  });
  ASSERT_EQ(lines.size(), 1u);
  const std::string tail = "[stashd.test] said in words: rank 3";
  ASSERT_GE(lines[0].size(), tail.size());
  EXPECT_EQ(lines[0].substr(lines[0].size() - tail.size()), tail) << lines[0];
}

TEST(LogStartFailure, IsOneJsonObjectInJsonFormat) {
  const auto json = Captured(LogFormat::kJson, [] { LogStartFailure("socket \"x\" busy"); });
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0].rfind(R"({"time":")", 0), 0u) << json[0];
  EXPECT_NE(
      json[0].find(R"(","level":"critical","logger":"stashd.main","message":"socket \"x\" busy"})"),
      std::string::npos)
      << json[0];
  const auto text = Captured(LogFormat::kText, [] { LogStartFailure("socket busy"); });
  ASSERT_EQ(text.size(), 1u);
  EXPECT_EQ(text[0], "stashd: socket busy");
}

}  // namespace
}  // namespace stash

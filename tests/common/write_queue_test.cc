// WriteQueue's close after the queued writes: how a client half-closes a session (its
// StartWritesDone must follow the last write, never overlap it, and never follow a failed one).
#include "common/write_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace stash {
namespace {

// Records what the stream would write; the test completes each write by hand.
struct FakeStream {
  std::vector<std::string> written;
  int writes_done = 0;
  WriteQueue<std::string> queue{[this](const std::string* m) { written.push_back(*m); }};
};

TEST(WriteQueue, CloseAfterWritesRunsLastOnceTheQueuedWritesCompleted) {
  FakeStream s;
  ASSERT_TRUE(s.queue.Push("a"));
  ASSERT_TRUE(s.queue.Push("b"));
  ASSERT_TRUE(s.queue.CloseAfterWrites([&] { ++s.writes_done; }));
  EXPECT_FALSE(s.queue.Push("c")) << "closed: later messages are refused";
  EXPECT_EQ(s.writes_done, 0) << "\"a\" is still on the wire";
  s.queue.OnWriteDone(true);  // "a" done, "b" starts
  EXPECT_EQ(s.writes_done, 0);
  s.queue.OnWriteDone(true);  // "b" done: the queue drained
  EXPECT_EQ(s.writes_done, 1);
  EXPECT_EQ(s.written, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(s.queue.CloseAfterWrites([&] { ++s.writes_done; })) << "closed already";
  EXPECT_EQ(s.writes_done, 1);
}

TEST(WriteQueue, CloseAfterWritesOnAnIdleQueueRunsLastAtOnce) {
  FakeStream s;
  ASSERT_TRUE(s.queue.CloseAfterWrites([&] { ++s.writes_done; }));
  EXPECT_EQ(s.writes_done, 1);
  EXPECT_TRUE(s.written.empty());
}

TEST(WriteQueue, AFailedWriteDropsTheCloseAction) {
  FakeStream s;
  ASSERT_TRUE(s.queue.Push("a"));
  ASSERT_TRUE(s.queue.Push("b"));
  ASSERT_TRUE(s.queue.CloseAfterWrites([&] { ++s.writes_done; }));
  s.queue.OnWriteDone(false);  // the stream broke: "b" is dropped, and so is the half-close
  EXPECT_EQ(s.writes_done, 0);
  EXPECT_EQ(s.written, (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace stash

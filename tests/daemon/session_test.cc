// A session's answers (daemon/sessions/session.cc): whatever a message quotes, it leaves as valid
// UTF-8.
#include "daemon/sessions/session.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/text.h"

namespace stash::daemon {
namespace {

class Collect final : public ResponseSink {
 public:
  void Send(stash::v1::SessionResponse response) override { got.push_back(std::move(response)); }
  std::vector<stash::v1::SessionResponse> got;
};

// A message built from bytes a client sent (a name that is not UTF-8) would make a generated
// client drop the whole stream ("Exception deserializing response"): Send escapes it.
TEST(Session, EveryMessageLeavesAsValidUtf8) {
  Collect sink;
  std::atomic<uint64_t> rejected{0};
  Session session(SessionInfo{}, &sink, &rejected);
  stash::v1::SessionResponse r;
  r.set_request_id(1);
  r.set_code(9);
  r.set_message("cannot open memory 7 named /stashd-\xff\xfe\xfd: no such file");
  session.Send(r);
  r.set_request_id(2);
  r.set_message("ticket 0x0000000000000001 holds no data \xe2\x82\xac");
  session.Send(r);
  ASSERT_EQ(sink.got.size(), 2u);
  EXPECT_EQ(sink.got[0].message(),
            "cannot open memory 7 named /stashd-\\xff\\xfe\\xfd: no such file");
  EXPECT_TRUE(IsUtf8(sink.got[0].message()));
  EXPECT_EQ(sink.got[1].message(), "ticket 0x0000000000000001 holds no data \xe2\x82\xac");
  EXPECT_EQ(rejected.load(), 2u);
  // And it parses again on the other side.
  stash::v1::SessionResponse back;
  EXPECT_TRUE(back.ParseFromString(sink.got[0].SerializeAsString()));
}

}  // namespace
}  // namespace stash::daemon

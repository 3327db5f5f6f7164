// Packets with descriptors over SOCK_SEQPACKET (common/descriptor_socket.h).
#include "common/descriptor_socket.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <vector>

namespace stash {
namespace {

using ::testing::HasSubstr;

struct Pair {
  UniqueFd a, b;
};

Pair SocketPair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

UniqueFd DevNull() { return UniqueFd(open("/dev/null", O_RDWR | O_CLOEXEC)); }

TEST(DescriptorSocket, APacketAndItsDescriptorsArriveTogether) {
  Pair p = SocketPair();
  UniqueFd null = DevNull();
  ASSERT_TRUE(SendPacket(p.a.get(), "hello", {null.get(), null.get()}).ok());
  auto packet = ReceivePacket(p.b.get());
  ASSERT_TRUE(packet.ok()) << packet.status().ToString();
  EXPECT_EQ(packet->bytes, "hello");
  ASSERT_EQ(packet->fds.size(), 2U);
  struct stat a {
  }, b{};
  ASSERT_EQ(fstat(packet->fds[0].get(), &a), 0);
  ASSERT_EQ(fstat(null.get(), &b), 0);
  EXPECT_EQ(a.st_rdev, b.st_rdev);
  EXPECT_NE(fcntl(packet->fds[0].get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(DescriptorSocket, PacketsKeepTheirBoundaries) {
  Pair p = SocketPair();
  ASSERT_TRUE(SendPacket(p.a.get(), "one", {}).ok());
  ASSERT_TRUE(SendPacket(p.a.get(), "two", {}).ok());
  EXPECT_EQ(ReceivePacket(p.b.get())->bytes, "one");
  EXPECT_EQ(ReceivePacket(p.b.get())->bytes, "two");
  EXPECT_EQ(ReceivePacket(p.b.get(), true).status().code(), StatusCode::kUnavailable);
}

TEST(DescriptorSocket, AnOversizedPacketIsRefused) {
  Pair p = SocketPair();
  const std::string big(kMaxPacketBytes + 100, 'x');
  EXPECT_EQ(SendPacket(p.a.get(), big, {}).code(), StatusCode::kInvalidArgument);
  // A peer that does not use SendPacket can still send one: the receiver refuses it.
  ASSERT_EQ(send(p.a.get(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  auto packet = ReceivePacket(p.b.get());
  EXPECT_EQ(packet.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(packet.status().message(), HasSubstr("at most"));
}

TEST(DescriptorSocket, TooManyDescriptorsAreRefusedAndNoneLeaks) {
  Pair p = SocketPair();
  UniqueFd null = DevNull();
  std::vector<int> many(kMaxPacketDescriptors + 3, null.get());
  // Build the message by hand: SendPacket itself refuses this many.
  iovec iov{const_cast<char*>("x"), 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * many.size()));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * many.size());
  std::memcpy(CMSG_DATA(c), many.data(), sizeof(int) * many.size());
  ASSERT_EQ(sendmsg(p.a.get(), &msg, 0), 1);
  const int next_before = DevNull().get();  // the lowest free descriptor number now
  auto packet = ReceivePacket(p.b.get());
  EXPECT_EQ(packet.status().code(), StatusCode::kInvalidArgument);
  const UniqueFd probe = DevNull();
  EXPECT_EQ(probe.get(), next_before);  // every received descriptor was closed again
}

TEST(DescriptorSocket, APeerThatClosedIsOutOfRange) {
  Pair p = SocketPair();
  p.a.reset();
  EXPECT_EQ(ReceivePacket(p.b.get()).status().code(), StatusCode::kOutOfRange);
}

TEST(DescriptorSocket, WaitReadableTimesOut) {
  Pair p = SocketPair();
  EXPECT_EQ(WaitReadable(p.b.get(), 1).code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(SendPacket(p.a.get(), "x", {}).ok());
  EXPECT_TRUE(WaitReadable(p.b.get(), 1000).ok());
}

}  // namespace
}  // namespace stash

// Client memory as sealed memfds (common/shm.h): what the daemon accepts and refuses.
#include "common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace stash {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBytes = 1 << 16;

UniqueFd Memfd(unsigned flags, uint64_t bytes) {
  UniqueFd fd(memfd_create("shm-test", MFD_CLOEXEC | flags));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  return fd;
}

UniqueFd SealedMemfd(uint64_t bytes, int seals = static_cast<int>(kClientMemorySeals)) {
  UniqueFd fd = Memfd(MFD_ALLOW_SEALING, bytes);
  EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  return fd;
}

void ExpectRefused(int fd, uint64_t bytes, const std::string& why,
                   const std::string& fix = "HostBuffer::Allocate") {
  const Status s = CheckClientMemoryFd(fd, bytes);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(why));
  EXPECT_THAT(s.message(), HasSubstr(fix));
}

size_t StashdFilesInDevShm() {
  size_t n = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "stashd", 6) == 0) ++n;
  }
  closedir(dir);
  return n;
}

TEST(ClientMemory, CreatedSealedAgainstResizingAndWithoutAName) {
  const size_t before = StashdFilesInDevShm();
  auto memory = SharedMemory::CreateSealed("shm-test", kBytes);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ(StashdFilesInDevShm(), before);  // nothing to open by name, nothing left behind
  const int fd = (*memory)->fd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(static_cast<unsigned>(fcntl(fd, F_GET_SEALS)) & kClientMemorySeals, kClientMemorySeals);
  // Neither the owner nor anyone it hands the descriptor to can shrink or grow it.
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd, kBytes * 2), 0);
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);  // and nobody adds a write seal later
  EXPECT_TRUE(CheckClientMemoryFd(fd, kBytes).ok());
}

TEST(ClientMemory, AMappedDescriptorSharesTheBytes) {
  auto memory = SharedMemory::CreateSealed("shm-test", kBytes);
  ASSERT_TRUE(memory.ok());
  std::memset((*memory)->data(), 0x5a, kBytes);
  auto mapped = SharedMemory::MapClientFd(UniqueFd(dup((*memory)->fd())), kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ((*mapped)->data()[kBytes - 1], 0x5a);
  (*mapped)->data()[0] = 0x11;
  EXPECT_EQ((*memory)->data()[0], 0x11);
  EXPECT_EQ((*mapped)->fd(), -1);  // the mapping keeps the memory; no descriptor is kept
}

TEST(ClientMemory, AnUnsealedMemfdIsRefused) {
  UniqueFd plain = Memfd(0, kBytes);  // without MFD_ALLOW_SEALING it reads as F_SEAL_SEAL alone
  ExpectRefused(plain.get(), kBytes, "it has F_SEAL_SEAL;");
  UniqueFd unsealed = Memfd(MFD_ALLOW_SEALING, kBytes);
  ExpectRefused(unsealed.get(), kBytes, "lacks seals");
  UniqueFd shrinkable = SealedMemfd(kBytes, F_SEAL_GROW | F_SEAL_SEAL);
  ExpectRefused(shrinkable.get(), kBytes, "F_SEAL_SHRINK");
}

TEST(ClientMemory, AWriteSealedMemfdIsRefused) {
  UniqueFd fd = SealedMemfd(kBytes, static_cast<int>(kClientMemorySeals) | F_SEAL_WRITE);
  ExpectRefused(fd.get(), kBytes, "write-sealed");
}

TEST(ClientMemory, AMemfdSmallerThanDeclaredIsRefused) {
  UniqueFd fd = SealedMemfd(4096);
  ExpectRefused(fd.get(), 8192, "holds 4096 bytes, less than the 8192 declared",
                "declare the size it was allocated with");
  EXPECT_TRUE(CheckClientMemoryFd(fd.get(), 4096).ok());
}

TEST(ClientMemory, AReadOnlyDescriptorIsRefused) {
  UniqueFd fd = SealedMemfd(kBytes);
  UniqueFd read_only(open(("/proc/self/fd/" + std::to_string(fd.get())).c_str(), O_RDONLY));
  ASSERT_TRUE(read_only.valid());
  ExpectRefused(read_only.get(), kBytes, "reading and writing");
}

TEST(ClientMemory, DescriptorsThatAreNotMemfdsAreRefused) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  ExpectRefused(read_end.get(), kBytes, "allows sealing");
  char path[] = "/tmp/shm-test-XXXXXX";
  UniqueFd file(mkstemp(path));
  ASSERT_TRUE(file.valid());
  unlink(path);
  ASSERT_EQ(ftruncate(file.get(), kBytes), 0);
  ExpectRefused(file.get(), kBytes, "sealing");
  ExpectRefused(-1, kBytes, "allows sealing");
}

TEST(ClientMemory, ZeroBytesIsRefused) {
  EXPECT_EQ(SharedMemory::CreateSealed("shm-test", 0).status().code(),
            StatusCode::kInvalidArgument);
  UniqueFd fd = SealedMemfd(kBytes);
  EXPECT_EQ(CheckClientMemoryFd(fd.get(), 0).code(), StatusCode::kInvalidArgument);
}

// Warming writes each page once and changes no byte, also while a copy runs into the memory:
// what the copy wrote stays (an OR of zero, atomic against its stores).
TEST(WriteEachPage, ChangesNoByteEvenBesideACopy) {
  constexpr uint64_t kSize = 64 * 4096 + 100;  // a partial page at the end
  std::vector<uint8_t> memory(kSize);
  for (uint64_t i = 0; i < kSize; ++i) memory[i] = static_cast<uint8_t>(i * 13 + 1);
  const std::vector<uint8_t> before = memory;
  WriteEachPage(memory.data(), kSize);
  EXPECT_EQ(memory, before);

  const std::vector<uint8_t> copied(kSize, 0xA5);
  for (int round = 0; round < 20; ++round) {
    std::fill(memory.begin(), memory.end(), 0);
    std::thread copy([&] { std::memcpy(memory.data(), copied.data(), kSize); });
    WriteEachPage(memory.data(), kSize);
    copy.join();
    ASSERT_EQ(memory, copied) << "round " << round;
  }
}

}  // namespace
}  // namespace stash

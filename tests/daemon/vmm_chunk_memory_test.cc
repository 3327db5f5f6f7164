// VmmChunkMemory (daemon/cuda/vmm_chunk_memory.h) on the CUDA driver stand-in (tests/cuda_standin):
// granularity, refusals, lazy chunks, export to another process, and the renew order against a
// VRAM budget shared by every process.
#include "daemon/cuda/vmm_chunk_memory.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "tests/vmm_standin.h"

namespace stash::daemon {

using client::CudaLeaseMemory;
namespace {

using stash::testing::Child;
using stash::testing::Standin;

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kGranularity = 2 * kMiB;  // the stand-in's, an H100's
constexpr uint64_t kPage = 64 << 10;         // --page-bytes below the granularity

TEST(VmmChunkMemory, RoundsChunksUpAndThePoolDownToTheGranularity) {
  const CudaDriver* d = Standin::Reset();
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", 17 * kMiB, 3 * kMiB, kPage);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  const VmmChunkMemory& m = **memory;
  EXPECT_EQ(m.granularity(), kGranularity);
  EXPECT_EQ(m.chunk_bytes(), 4 * kMiB);  // 3 MiB up to whole 2 MiB
  EXPECT_EQ(m.bytes(), 16 * kMiB);       // 17 MiB down to whole 2 MiB
  EXPECT_EQ(m.chunks(), 4u);
  EXPECT_EQ(m.ChunkBytes(3), 4 * kMiB);
  EXPECT_NE(m.base(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.base()) % kGranularity, 0u);

  // A last chunk shorter than the others, still whole granularity units.
  auto odd = VmmChunkMemory::Create(d, 0, "pool0-odd", 10 * kMiB, 4 * kMiB, kPage);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_EQ((*odd)->chunks(), 3u);
  EXPECT_EQ((*odd)->ChunkBytes(2), 2 * kMiB);
  ASSERT_TRUE((*odd)->Ensure(2).ok());

  // Less than one granularity unit is no pool.
  auto tiny = VmmChunkMemory::Create(d, 0, "tiny", kMiB, kMiB, kPage);
  EXPECT_EQ(tiny.status().code(), StatusCode::kInvalidArgument);
}

// --page-bytes above the granularity (4 MiB pages, 2 MiB granularity): the chunk and the pool
// round to whole pages, so the last chunk never ends mid-page; a chunk that is not whole pages,
// or a page size that is not a power of two, is refused.
TEST(VmmChunkMemory, RoundsToWholePagesWhenAPageIsLargerThanTheGranularity) {
  const CudaDriver* d = Standin::Reset();
  const uint64_t page = 4 * kMiB;
  auto memory = VmmChunkMemory::Create(d, 0, "big-pages", 18 * kMiB, 8 * kMiB, page);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  const VmmChunkMemory& m = **memory;
  EXPECT_EQ(m.chunk_bytes(), 8 * kMiB);
  EXPECT_EQ(m.bytes(), 16 * kMiB);  // 18 MiB down to whole 4 MiB pages, not to 2 MiB units
  EXPECT_EQ(m.chunks(), 2u);

  // A last chunk shorter than the others is still whole pages (and granularity units).
  auto odd = VmmChunkMemory::Create(d, 0, "big-pages-odd", 14 * kMiB, 8 * kMiB, page);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_EQ((*odd)->bytes(), 12 * kMiB);
  ASSERT_EQ((*odd)->chunks(), 2u);
  EXPECT_EQ((*odd)->ChunkBytes(1), 4 * kMiB);
  for (uint64_t c = 0; c < (*odd)->chunks(); ++c) {
    EXPECT_EQ((*odd)->ChunkBytes(c) % page, 0u) << "chunk " << c;
    EXPECT_EQ((*odd)->ChunkBytes(c) % kGranularity, 0u) << "chunk " << c;
    ASSERT_TRUE((*odd)->Ensure(c).ok()) << "chunk " << c;
  }

  // A chunk rounds up to whole pages where the page is the larger unit: 1 MiB pages, 3 MiB
  // chunks -> 4 MiB (the granularity's round-up is whole pages too).
  auto up = VmmChunkMemory::Create(d, 0, "mib-pages", 9 * kMiB, 3 * kMiB, kMiB);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ((*up)->chunk_bytes(), 4 * kMiB);
  EXPECT_EQ((*up)->bytes(), 8 * kMiB);

  // Refused: a chunk that is not whole pages, a page size that is not a power of two (or 0),
  // a pool of less than one page.
  EXPECT_EQ(VmmChunkMemory::Create(d, 0, "p", 16 * kMiB, 6 * kMiB, page).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(VmmChunkMemory::Create(d, 0, "p", 16 * kMiB, 2 * kMiB, page).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(VmmChunkMemory::Create(d, 0, "p", 16 * kMiB, 6 * kMiB, 3 * kMiB).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(VmmChunkMemory::Create(d, 0, "p", 16 * kMiB, 4 * kMiB, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(VmmChunkMemory::Create(d, 0, "p", 2 * kMiB, 4 * kMiB, page).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(VmmChunkMemory, NamesItsGpuByUuidTheWayNvidiaSmiDoes) {
  const CudaDriver* d = Standin::Reset();
  auto zero = VmmChunkMemory::Create(d, 0, "pool0", 8 * kMiB, 2 * kMiB, kPage);
  auto one = VmmChunkMemory::Create(d, 1, "pool1", 8 * kMiB, 2 * kMiB, kPage);
  ASSERT_TRUE(zero.ok() && one.ok());
  const std::regex spelled("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  EXPECT_TRUE(std::regex_match((*zero)->uuid(), spelled)) << (*zero)->uuid();
  EXPECT_NE((*zero)->uuid(), (*one)->uuid());
  auto ordinal = GpuOrdinalOfUuid(d, (*one)->uuid());
  ASSERT_TRUE(ordinal.ok()) << ordinal.status().ToString();
  EXPECT_EQ(*ordinal, 1);
  EXPECT_EQ(GpuOrdinalOfUuid(d, "GPU-00000000-0000-0000-0000-000000000000").status().code(),
            StatusCode::kNotFound);
}

TEST(VmmChunkMemory, RefusesAGpuWithoutVmmNamingItAndTheWayOut) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_NO_VMM", "1"}});
  auto uuid = GpuUuid(d, 0);
  ASSERT_TRUE(uuid.ok());
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", 8 * kMiB, 2 * kMiB, kPage);
  ASSERT_EQ(memory.status().code(), StatusCode::kFailedPrecondition);
  const std::string& why = memory.status().message();
  EXPECT_NE(why.find("GPU 0 (" + *uuid + ")"), std::string::npos) << why;
  EXPECT_NE(why.find("virtual memory management"), std::string::npos) << why;
  EXPECT_NE(why.find("mapped mode needs"), std::string::npos) << why;
}

TEST(VmmChunkMemory, RefusesAGpuWithoutPosixFdHandles) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_NO_POSIX_FD", "1"}});
  auto memory = VmmChunkMemory::Create(d, 1, "pool1", 8 * kMiB, 2 * kMiB, kPage);
  ASSERT_EQ(memory.status().code(), StatusCode::kFailedPrecondition);
  const std::string& why = memory.status().message();
  EXPECT_NE(why.find("GPU 1 ("), std::string::npos) << why;
  EXPECT_NE(why.find("POSIX file descriptors"), std::string::npos) << why;
  EXPECT_EQ(why.find("virtual memory management"), std::string::npos) << why;
  EXPECT_NE(why.find("mapped mode needs"), std::string::npos) << why;
}

TEST(VmmChunkMemory, CreatesChunksOnlyWhenEnsured) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_VRAM_BYTES", std::to_string(64 * kMiB)}});
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", 16 * kMiB, 4 * kMiB, kPage);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  VmmChunkMemory& m = **memory;
  EXPECT_EQ(Standin::DeviceBytesInUse(0), 0);
  for (uint64_t c = 0; c < m.chunks(); ++c) EXPECT_FALSE(m.present(c));
  EXPECT_EQ(m.ExportFd(1).status().code(), StatusCode::kFailedPrecondition);

  ASSERT_TRUE(m.Ensure(1).ok());
  EXPECT_TRUE(m.present(1));
  EXPECT_FALSE(m.present(0));
  EXPECT_EQ(m.bytes_present(), 4 * kMiB);
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(4 * kMiB));
  // Mapped, accessible and zero-filled (the driver promises no zeros: a memset did it).
  uint8_t* chunk1 = m.base() + m.chunk_bytes();
  EXPECT_TRUE(stash::testing::AllZero(chunk1, m.chunk_bytes()));
  chunk1[0] = 7;
  // Ensuring a present chunk changes nothing.
  ASSERT_TRUE(m.Ensure(1).ok());
  EXPECT_EQ(chunk1[0], 7);
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(4 * kMiB));

  memory->reset();
  EXPECT_EQ(Standin::DeviceBytesInUse(0), 0);
}

// A restarted daemon starts while ranks still map the old daemon's chunks: nothing is allocated
// at start, and a chunk that does not fit yet says so and fits once the old memory is gone.
TEST(VmmChunkMemory, ARestartedPoolStartsWhileTheOldPoolsMemoryIsStillHeld) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_VRAM_BYTES", std::to_string(8 * kMiB)}});
  auto old_pool = VmmChunkMemory::Create(d, 0, "old", 8 * kMiB, 4 * kMiB, kPage);
  ASSERT_TRUE(old_pool.ok());
  ASSERT_TRUE((*old_pool)->Ensure(0).ok());
  ASSERT_TRUE((*old_pool)->Ensure(1).ok());

  auto new_pool = VmmChunkMemory::Create(d, 0, "new", 8 * kMiB, 4 * kMiB, kPage);
  ASSERT_TRUE(new_pool.ok()) << new_pool.status().ToString();
  const Status full = (*new_pool)->Ensure(0);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_NE(full.message().find("try later"), std::string::npos) << full.message();
  EXPECT_FALSE((*new_pool)->present(0));

  old_pool->reset();
  EXPECT_TRUE((*new_pool)->Ensure(0).ok());
  EXPECT_TRUE((*new_pool)->Ensure(1).ok());
}

// The rank side of a chunk, in a child process: imports `fd`, maps it, checks the pattern and
// writes its own, tells the parent, and waits for "unmap" before it unmaps and exits.
int HoldInChild(const CudaDriver* d, int socket, uint64_t bytes, uint8_t expect, uint8_t write) {
  std::vector<UniqueFd> fds;
  if (stash::testing::Receive(socket, &fds) != "chunk" || fds.size() != 1) return 10;
  auto lease = CudaLeaseMemory::Create(d, 0, bytes, {bytes, bytes, bytes});
  if (!lease.ok()) return 11;
  if (!(*lease)->Map(kernels::kLeaseDevice, 0, std::move(fds[0]), bytes, 0).ok()) return 12;
  uint8_t* p = (*lease)->base(kernels::kLeaseDevice);
  if (!stash::testing::HasPattern(p, bytes, expect)) return 13;
  stash::testing::FillPattern(p, bytes, write);
  if (!stash::testing::Send(socket, "mapped")) return 14;
  if (stash::testing::Receive(socket) != "unmap") return 15;
  lease->reset();  // unmaps (nothing queued on any stream)
  if (!stash::testing::Send(socket, "unmapped")) return 16;
  (void)stash::testing::Receive(socket);  // lives on, unmapped, until the parent is done
  return 0;
}

TEST(VmmChunkMemory, AnExportedChunkSharesItsBytesWithAnotherProcess) {
  const CudaDriver* d = Standin::Reset();
  const uint64_t bytes = 4 * kMiB;
  // Forked before the pool exists, so the child inherits none of its references.
  auto child = Child::Start([&](int s) { return HoldInChild(d, s, bytes, 3, 9); });
  ASSERT_NE(child, nullptr);
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", 8 * kMiB, bytes, kPage);
  ASSERT_TRUE(memory.ok());
  VmmChunkMemory& m = **memory;
  ASSERT_TRUE(m.Ensure(1).ok());
  uint8_t* chunk = m.base() + m.chunk_bytes();
  stash::testing::FillPattern(chunk, m.chunk_bytes(), 3);
  auto fd = m.ExportFd(1);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(stash::testing::Send(child->socket(), "chunk", {fd->get()}));
  fd->reset();
  ASSERT_EQ(stash::testing::Receive(child->socket()), "mapped");
  // The child's writes are in the daemon's mapping: one memory.
  EXPECT_TRUE(stash::testing::HasPattern(chunk, bytes, 9));
  ASSERT_TRUE(stash::testing::Send(child->socket(), "unmap"));
  EXPECT_EQ(stash::testing::Receive(child->socket()), "unmapped");
  ASSERT_TRUE(stash::testing::Send(child->socket(), "bye"));
  EXPECT_EQ(child->Wait(), 0);
}

TEST(VmmChunkMemory, RenewGivesZeroedMemoryAtTheSameAddress) {
  const CudaDriver* d = Standin::Reset();
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", 8 * kMiB, 4 * kMiB, kPage);
  ASSERT_TRUE(memory.ok());
  VmmChunkMemory& m = **memory;
  ASSERT_TRUE(m.Ensure(0).ok());
  stash::testing::FillPattern(m.base(), m.chunk_bytes(), 1);
  uint8_t* const base = m.base();
  ASSERT_TRUE(m.Renew(0).ok());
  EXPECT_EQ(m.base(), base);
  EXPECT_TRUE(m.present(0));
  EXPECT_TRUE(stash::testing::AllZero(m.base(), m.chunk_bytes()));
  // Renewing an absent chunk creates it.
  EXPECT_FALSE(m.present(1));
  ASSERT_TRUE(m.Renew(1).ok());
  EXPECT_TRUE(m.present(1));
}

// The budget fits the pool and nothing more. Renewing with no holder succeeds only because the
// old allocation is released before the new one is created. With a holder that still maps the
// old allocation, that memory stays alive and counted (it is the holder's), so the renew finds
// no room: RESOURCE_EXHAUSTED, the chunk absent, nothing retired; once the holder unmapped, the
// next renew succeeds.
TEST(VmmChunkMemory, RenewReleasesTheOldMemoryBeforeCreatingTheNew) {
  const uint64_t pool = 8 * kMiB;
  const uint64_t bytes = 4 * kMiB;
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_VRAM_BYTES", std::to_string(pool)}});
  // The holder, forked before the pool exists so that it inherits none of its references: what
  // keeps old memory alive below is its mapping alone.
  auto child = Child::Start([&](int s) { return HoldInChild(d, s, bytes, 5, 6); });
  ASSERT_NE(child, nullptr);
  auto memory = VmmChunkMemory::Create(d, 0, "pool0", pool, bytes, kPage);
  ASSERT_TRUE(memory.ok());
  VmmChunkMemory& m = **memory;
  ASSERT_TRUE(m.Ensure(0).ok());
  ASSERT_TRUE(m.Ensure(1).ok());
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(pool));

  // No holder: release first, so the full budget is enough.
  ASSERT_TRUE(m.Renew(0).ok());
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(pool));

  // A holder maps chunk 0's current memory.
  stash::testing::FillPattern(m.base(), m.chunk_bytes(), 5);
  auto fd = m.ExportFd(0);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(stash::testing::Send(child->socket(), "chunk", {fd->get()}));
  fd->reset();  // the exported descriptor holds the memory too
  ASSERT_EQ(stash::testing::Receive(child->socket()), "mapped");

  const Status renewed = m.Renew(0);
  EXPECT_EQ(renewed.code(), StatusCode::kResourceExhausted) << renewed.ToString();
  EXPECT_FALSE(m.present(0));
  EXPECT_EQ(m.bytes_present(), bytes);  // chunk 1 only
  // Ours released; the holder's mapping keeps the old memory, counted.
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(pool));
  EXPECT_EQ(m.Ensure(0).code(), StatusCode::kResourceExhausted);  // still no room

  // Unmapped, the holder still running: the old memory is gone and the renew fits.
  ASSERT_TRUE(stash::testing::Send(child->socket(), "unmap"));
  ASSERT_EQ(stash::testing::Receive(child->socket()), "unmapped");
  ASSERT_TRUE(m.Renew(0).ok());
  EXPECT_TRUE(m.present(0));
  EXPECT_TRUE(stash::testing::AllZero(m.base(), bytes));
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(pool));
  ASSERT_TRUE(stash::testing::Send(child->socket(), "bye"));
  EXPECT_EQ(child->Wait(), 0);
}

}  // namespace
}  // namespace stash::daemon

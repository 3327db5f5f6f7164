// PinnedChunkMemory (daemon/cuda/pinned_chunk_memory.h) on the CUDA driver stand-in
// (tests/cuda_standin): every chunk page-locked for the GPU at its host address, and a renew
// that registers the fresh memory in place of the old, so work on the stream writes what the
// CPU (and the next holder) sees, never the pages a former holder still maps.
#include "daemon/cuda/pinned_chunk_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "common/macros.h"
#include "tests/vmm_standin.h"

namespace stash::daemon {
namespace {

using stash::testing::Standin;

constexpr uint64_t kMiB = 1ULL << 20;

// Writes `value` at `address` from the GPU's side (a stream memory operation, which the
// stand-in refuses on host memory that is not registered) and waits for it.
Status WriteOnTheStream(const CudaDriver* d, void* address, uint64_t value) {
  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(d, 0));
  const PrimaryContext::Scope scope(context);
  STASH_RETURN_IF_ERROR(scope.status());
  CUstream stream = nullptr;
  STASH_CU_RETURN_IF_ERROR(d, StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const Status written =
      d->WriteValueAfterBarrier(stream, reinterpret_cast<CUdeviceptr>(address), value);
  const CUresult synced = d->StreamSynchronize(stream);
  (void)d->StreamDestroy(stream);
  STASH_RETURN_IF_ERROR(written);
  return d->Check(synced, "cuStreamSynchronize");
}

// The first 8 bytes of a memfd, read through a mapping of its own.
uint64_t FirstWordOf(int fd) {
  void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ~uint64_t{0};
  uint64_t word = 0;
  std::memcpy(&word, p, sizeof(word));
  munmap(p, 4096);
  return word;
}

TEST(PinnedChunkMemory, EveryChunkIsReachableFromTheGpuAtItsHostAddress) {
  const CudaDriver* d = Standin::Reset();
  auto created = PinnedChunkMemory::Create(d, 0, "host0", 5 * kMiB, 2 * kMiB, {});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PinnedChunkMemory& m = **created;
  ASSERT_EQ(m.chunks(), 3u);
  EXPECT_EQ(m.ChunkBytes(2), kMiB);  // the last chunk is shorter
  // The daemon populated and locked every page: a returned chunk stays its holder's until exit.
  EXPECT_TRUE(m.ChargeReturnsUntilExit());
  EXPECT_EQ(m.memory()->bytes_warm(), 5 * kMiB) << "registered chunks count as warm";
  auto context = PrimaryContext::Retain(d, 0);
  ASSERT_TRUE(context.ok());
  const PrimaryContext::Scope scope(*context);  // for cuMemHostGetDevicePointer
  for (uint64_t c = 0; c < m.chunks(); ++c) {
    EXPECT_TRUE(m.present(c));
    uint8_t* host = m.base() + c * m.chunk_bytes();
    CUdeviceptr device = 0;
    ASSERT_EQ(d->MemHostGetDevicePointer(&device, host, 0), CUDA_SUCCESS) << "chunk " << c;
    EXPECT_EQ(device, reinterpret_cast<CUdeviceptr>(host));
    // The last word of each chunk too: the registration covers it whole.
    uint8_t* last = host + m.ChunkBytes(c) - 8;
    ASSERT_TRUE(WriteOnTheStream(d, last, 40 + c).ok());
    uint64_t seen = 0;
    std::memcpy(&seen, last, 8);
    EXPECT_EQ(seen, 40 + c);
  }
}

TEST(PinnedChunkMemory, ARenewedChunkIsFreshZeroedAndRegisteredWhileTheOldHolderKeepsItsBytes) {
  const CudaDriver* d = Standin::Reset();
  auto created = PinnedChunkMemory::Create(d, 0, "host0", 4 * kMiB, 2 * kMiB, {});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PinnedChunkMemory& m = **created;
  uint8_t* chunk1 = m.base() + m.chunk_bytes();
  ASSERT_TRUE(WriteOnTheStream(d, chunk1, 0x1111).ok());

  // A holder's descriptor of the chunk as it was leased.
  auto held = m.ExportFd(1);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(FirstWordOf(held->get()), 0x1111u);

  ASSERT_TRUE(m.Renew(1).ok());
  EXPECT_TRUE(m.present(1));
  uint64_t word = 1;
  std::memcpy(&word, chunk1, 8);
  EXPECT_EQ(word, 0u) << "a renewed chunk starts zero-filled";
  // The GPU now writes the fresh memory: the CPU sees it at the same address, the old holder
  // does not.
  ASSERT_TRUE(WriteOnTheStream(d, chunk1, 0x2222).ok());
  std::memcpy(&word, chunk1, 8);
  EXPECT_EQ(word, 0x2222u);
  EXPECT_EQ(FirstWordOf(held->get()), 0x1111u);
  auto fresh = m.ExportFd(1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(FirstWordOf(fresh->get()), 0x2222u);
  // The neighbours kept their registration.
  EXPECT_TRUE(m.present(0));
  EXPECT_TRUE(WriteOnTheStream(d, m.base(), 7).ok());
}

TEST(PinnedChunkMemory, TheDestructorUnregistersEveryChunk) {
  const CudaDriver* d = Standin::Reset();
  uint8_t* base = nullptr;
  {
    auto created = PinnedChunkMemory::Create(d, 0, "host0", 4 * kMiB, 2 * kMiB, {});
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    base = (*created)->base();
  }
  // The range may be reused by anyone now; registering it again must find nothing left over.
  void* again = mmap(base, 4 * kMiB, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_NE(again, MAP_FAILED);
  auto context = PrimaryContext::Retain(d, 0);
  ASSERT_TRUE(context.ok());
  {
    const PrimaryContext::Scope scope(*context);
    EXPECT_EQ(d->MemHostRegister(again, 4 * kMiB, 0), CUDA_SUCCESS);
    EXPECT_EQ(d->MemHostUnregister(again), CUDA_SUCCESS);
  }
  munmap(again, 4 * kMiB);
}

}  // namespace
}  // namespace stash::daemon

// The client library's CUDA side (client/cuda_memory.h) on a real GPU: finding the cudaMalloc
// allocation of a pointer inside it, exporting its IPC handle once, refusing memory CUDA IPC
// cannot share with the message that says why, and the stream memory operations that raise
// and wait on event counters in host memory. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda_memory.h"

namespace stash {
namespace {

#define ASSERT_CUDA_OK(expr)                                       \
  do {                                                             \
    const cudaError_t stash_cuda_error_ = (expr);                  \
    ASSERT_EQ(stash_cuda_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_); \
  } while (0)

class ClientCudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_CUDA_OK(cudaSetDevice(0));
    auto side = CudaSide::Open(0);
    ASSERT_TRUE(side.ok()) << side.status().ToString();
    side_ = std::move(side).value();
  }
  std::unique_ptr<CudaSide> side_;
};

TEST_F(ClientCudaGpu, APointerInsideAnAllocationIsExportedOnceAtItsBase) {
  EXPECT_EQ(side_->uuid().size(), 16u);
  void* base = nullptr;
  ASSERT_CUDA_OK(cudaMalloc(&base, 1 << 20));
  auto* bytes = static_cast<uint8_t*>(base);
  auto first = side_->Locate(bytes + 256, 4096, "source");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->offset, 256u);
  EXPECT_GE(first->bytes, uint64_t{1} << 20);
  EXPECT_EQ(first->handle.size(), 64u);
  EXPECT_TRUE(first->stale_memory_ids.empty());
  auto again = side_->Locate(bytes + 8192, 16, "source");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->memory_id, first->memory_id);
  EXPECT_EQ(again->offset, 8192u);
  EXPECT_EQ(again->handle, first->handle);

  // The driver may round the allocation up: run past the size it reports.
  auto past = side_->Locate(bytes + first->bytes - 8, 64, "source");
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("runs past the end"), std::string::npos);

  EXPECT_EQ(side_->Forget(bytes + 100), first->memory_id);
  EXPECT_EQ(side_->Forget(bytes + 100), 0u);
  ASSERT_CUDA_OK(cudaFree(base));
}

TEST_F(ClientCudaGpu, MemoryIpcCannotShareIsRefusedWithTheReason) {
  void* managed = nullptr;
  ASSERT_CUDA_OK(cudaMallocManaged(&managed, 1 << 16));
  auto m = side_->Locate(managed, 64, "source");
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("managed memory"), std::string::npos)
      << m.status().ToString();
  ASSERT_CUDA_OK(cudaFree(managed));

  void* pinned = nullptr;
  ASSERT_CUDA_OK(cudaMallocHost(&pinned, 1 << 16));
  auto h = side_->Locate(pinned, 64, "source");
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("host memory"), std::string::npos) << h.status().ToString();
  ASSERT_CUDA_OK(cudaFreeHost(pinned));

  std::vector<uint8_t> plain(4096);
  auto p = side_->Locate(plain.data(), 64, "source");
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("not CUDA memory"), std::string::npos)
      << p.status().ToString();
}

TEST_F(ClientCudaGpu, StreamsRaiseAndWaitOnCountersInMappedHostMemory) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  std::function<void()> unmap;
  auto address = side_->MapHost(page, 4096, &unmap);
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  auto* counters = static_cast<std::atomic<uint64_t>*>(page);
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // The stream raises counter 0.
  ASSERT_TRUE(side_->WriteValue(stream, *address, 7).ok());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(counters[0].load(), 7u);

  // The stream waits on counter 1 until the CPU raises it; work behind the wait holds.
  ASSERT_TRUE(side_->WaitValue(stream, *address + 8, 3).ok());
  ASSERT_TRUE(side_->WriteValue(stream, *address + 16, 1).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
  EXPECT_EQ(counters[2].load(), 0u);
  counters[1].store(3);
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(counters[2].load(), 1u);

  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
  unmap();
  munmap(page, 4096);
}

}  // namespace
}  // namespace stash

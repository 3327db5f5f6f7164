// The client library's CUDA side (client/memory/cuda_memory.h) on a real GPU: finding the
// cudaMalloc allocation of a pointer inside it, exporting its IPC handle once, refusing memory CUDA
// IPC cannot share with the message that says why, and the stream memory operations that raise and
// wait on event counters in host memory. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/memory/cuda_memory.h"
#include "common/cuda_driver.h"

namespace stash::client {
namespace {

#define ASSERT_CUDA_OK(expr)                                       \
  do {                                                             \
    const cudaError_t stash_cuda_error_ = (expr);                  \
    ASSERT_EQ(stash_cuda_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_); \
  } while (0)

// An mmap'ed page as the owner MapHost keeps: unmapped when the last reference goes.
std::shared_ptr<void> MappedPage(void* page) {
  return std::shared_ptr<void>(page, [](void* p) { munmap(p, 4096); });
}

#define EXPECT_CUDA_OK(expr)                                       \
  do {                                                             \
    const cudaError_t stash_cuda_error_ = (expr);                  \
    EXPECT_EQ(stash_cuda_error_, cudaSuccess)                      \
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

  // Plain malloc memory is "not CUDA memory" to a driver without HMM; with HMM (open kernel
  // modules on Linux 6.1.24 and newer) the driver may call it host memory. Either refusal says
  // what to pass.
  std::vector<uint8_t> plain(4096);
  auto p = side_->Locate(plain.data(), 64, "source");
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  const std::string& why = p.status().message();
  EXPECT_TRUE(why.find("not CUDA memory") != std::string::npos ||
              why.find("host memory") != std::string::npos)
      << p.status().ToString();
}

TEST_F(ClientCudaGpu, StreamsRaiseAndWaitOnCountersInMappedHostMemory) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  std::function<void()> release;
  auto address = side_->MapHost(page, 4096, MappedPage(page), &release);
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
  release();
}

// Freeing an event buffer while a stream still waits on it (an exception path, a close before
// synchronize): the library keeps it mapped and registered, so the wait goes on reading it and
// the stream passes once the counter is raised, instead of faulting the context.
TEST_F(ClientCudaGpu, AFreedEventBufferStaysMappedForAStreamStillWaitingOnIt) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  std::shared_ptr<void> owner = MappedPage(page);
  std::function<void()> release;
  auto address = side_->MapHost(page, 4096, owner, &release);
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  auto* counters = static_cast<std::atomic<uint64_t>*>(page);
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE(side_->WaitValue(stream, *address, 5).ok());
  ASSERT_TRUE(side_->WriteValue(stream, *address + 8, 1).ok());

  release();      // what freeing the HostBuffer does
  owner.reset();  // and its memory: the library holds the last reference now
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
  counters[0].store(5);  // still mapped: the library kept it
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(counters[1].load(), 1u);
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// What the review could not settle without a GPU: cuMemHostRegister of a buffer smaller than a
// page (event buffers can be small) registers, maps and is written by a stream.
TEST_F(ClientCudaGpu, HostMemorySmallerThanAPageRegistersAndMaps) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  std::function<void()> release;
  auto address = side_->MapHost(page, 64, MappedPage(page), &release);
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE(side_->WriteValue(stream, *address + 56, 9).ok());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(static_cast<std::atomic<uint64_t>*>(page)[7].load(), 9u);
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
  release();
}

// cuPointerGetAttributes on plain malloc memory succeeds with memory type 0 (CUDA's documented
// behaviour for pointers it does not know), which Locate turns into "not CUDA memory"; with HMM
// (open kernel modules, Linux 6.1.24 and newer) the driver may report CU_MEMORYTYPE_HOST, which
// Locate turns into "host memory". Both are accepted; any other type, or a failing call, is not.
TEST_F(ClientCudaGpu, PointerAttributesOfPlainMallocMemoryAreEmpty) {
  auto driver = CudaDriver::Get();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  std::unique_ptr<uint8_t, decltype(&std::free)> plain(static_cast<uint8_t*>(std::malloc(4096)),
                                                       &std::free);
  ASSERT_NE(plain, nullptr);
  // Zeroed as Locate zeroes them; what matters is that the call succeeds rather than failing
  // (Locate would then return the driver's error instead of saying what to pass).
  unsigned int memory_type = 0;
  unsigned long long managed = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* values[] = {&memory_type, &managed};
  const CUresult result = (*driver)->PointerGetAttributes(
      2, attributes, values, reinterpret_cast<CUdeviceptr>(plain.get()));
  EXPECT_EQ(result, CUDA_SUCCESS);
  EXPECT_TRUE(memory_type == 0u || memory_type == CU_MEMORYTYPE_HOST) << memory_type;
  RecordProperty("malloc_memory_type", static_cast<int>(memory_type));
  EXPECT_EQ(managed, 0u);
}

// cuMemGetAddressRange on a pointer from cudaIpcOpenMemHandle (the daemon checks a registered
// size against it) gives the imported allocation's base and size. IPC needs two processes: this
// binary runs itself as the exporter (IpcExporter below), which allocates, sends its handle and
// keeps the allocation until this process says so.
constexpr uint64_t kExportBytes = 3 << 20;

TEST_F(ClientCudaGpu, AddressRangeOfAnIpcOpenedPointerIsTheExportedAllocation) {
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The pipes' ends stay open across exec (no O_CLOEXEC); their numbers go in the variable.
    const std::string fds = std::to_string(to_child[0]) + "," + std::to_string(from_child[1]);
    setenv("STASH_GPU_TEST_IPC_EXPORTER", fds.c_str(), 1);
    execl("/proc/self/exe", "/proc/self/exe", "--gtest_filter=ClientCudaGpuIpc.Exporter",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  cudaIpcMemHandle_t handle{};
  size_t got = 0;
  while (got < sizeof(handle)) {
    const ssize_t n =
        read(from_child[0], reinterpret_cast<char*>(&handle) + got, sizeof(handle) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ASSERT_EQ(got, sizeof(handle)) << "the exporter sent no handle";
  void* opened = nullptr;
  ASSERT_CUDA_OK(cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess));
  auto driver = CudaDriver::Get();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  CUdeviceptr base = 0;
  size_t bytes = 0;
  EXPECT_EQ((*driver)->MemGetAddressRange(&base, &bytes, reinterpret_cast<CUdeviceptr>(opened)),
            CUDA_SUCCESS);
  EXPECT_EQ(base, reinterpret_cast<CUdeviceptr>(opened));
  EXPECT_GE(bytes, kExportBytes);
  EXPECT_CUDA_OK(cudaIpcCloseMemHandle(opened));
  const char done = 'x';
  EXPECT_EQ(write(to_child[1], &done, 1), 1);
  close(to_child[1]);
  close(from_child[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exporter status " << status;
}

// The exporter half of the test above; skips unless that test started it.
TEST(ClientCudaGpuIpc, Exporter) {
  const char* fds = std::getenv("STASH_GPU_TEST_IPC_EXPORTER");
  if (fds == nullptr) {
    GTEST_SKIP() << "runs only as the exporter of AddressRangeOfAnIpcOpenedPointerIsTheExported"
                    "Allocation";
  }
  int in = -1, out = -1;
  ASSERT_EQ(std::sscanf(fds, "%d,%d", &in, &out), 2) << fds;
  void* memory = nullptr;
  ASSERT_CUDA_OK(cudaSetDevice(0));
  ASSERT_CUDA_OK(cudaMalloc(&memory, kExportBytes));
  cudaIpcMemHandle_t handle{};
  ASSERT_CUDA_OK(cudaIpcGetMemHandle(&handle, memory));
  ASSERT_EQ(write(out, &handle, sizeof(handle)), static_cast<ssize_t>(sizeof(handle)));
  char done = 0;
  ASSERT_EQ(read(in, &done, 1), 1);  // the importer closed its mapping
  ASSERT_CUDA_OK(cudaFree(memory));
}

}  // namespace
}  // namespace stash::client

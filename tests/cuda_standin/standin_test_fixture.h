// What the stand-in's tests share (standin_test.cc: devices, contexts and memory;
// standin_streams_test.cc: streams, events, capture and graphs): the stand-in loaded through the
// driver table in a registry folder of the test process's own, the fixture, and descriptor
// passing for the cross-process tests. TEST AID, NEVER A BACKEND (see standin.h).
#ifndef STASH_TESTS_CUDA_STANDIN_STANDIN_TEST_FIXTURE_H_
#define STASH_TESTS_CUDA_STANDIN_STANDIN_TEST_FIXTURE_H_

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_driver.h"
#include "common/descriptor_socket.h"
#include "standin.h"

namespace stash::standin_test {

inline constexpr size_t kChunk = size_t{2} << 20;  // the stand-in's granularity

// Every test process gets its own registry folder (so budgets never see another test run's
// memory) and a 64 MiB budget per device, before its first cuInit.
class RegistryEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (std::getenv("STASH_STANDIN_REGISTRY") == nullptr) {
      std::string dir = (std::filesystem::temp_directory_path() / "standin-test-XXXXXX").string();
      ASSERT_NE(mkdtemp(dir.data()), nullptr);
      setenv("STASH_STANDIN_REGISTRY", dir.c_str(), 1);
      owned_ = dir;
    }
    setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(64 * kChunk / 2).c_str(), 1);
  }
  void TearDown() override {
    if (!owned_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(owned_, ignored);
    }
  }

 private:
  std::string owned_;
};

inline ::testing::Environment* const kRegistryEnvironment =
    ::testing::AddGlobalTestEnvironment(new RegistryEnvironment);

// The loaded stand-in, one per process (dlopen hands back the same copy every time).
const CudaDriver& Driver() {
  static const CudaDriver* driver = [] {
    auto loaded = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().ToString();
      std::abort();
    }
    return loaded->release();  // never freed: process-wide, like the real driver
  }();
  return *driver;
}

template <typename Fn>
Fn Extra(const char* name) {
  void* symbol = dlsym(Driver().library, name);
  if (symbol == nullptr) std::abort();
  return reinterpret_cast<Fn>(symbol);
}

long long BytesInUse(int device) {
  return Extra<long long (*)(int)>("stash_standin_device_bytes_in_use")(device);
}

void RegisterKernel(const char* name, StashStandinKernel fn, std::vector<size_t> sizes) {
  using Register = int (*)(const char*, StashStandinKernel, unsigned, const size_t*);
  ASSERT_EQ(Extra<Register>("stash_standin_register_kernel")(
                name, fn, static_cast<unsigned>(sizes.size()), sizes.data()),
            0);
}

// The bytes behind a stand-in device address, and a descriptor as the pointer-sized OS handle
// cuMemImportFromShareableHandle takes.
template <typename T = void>
T* At(CUdeviceptr address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr): it is an address
}
void* OsHandle(int fd) {
  return reinterpret_cast<void*>(intptr_t{fd});  // NOLINT(performance-no-int-to-ptr): the API's
}

const char* Name(CUresult r) {
  const char* name = nullptr;
  return Driver().GetErrorName(r, &name) == CUDA_SUCCESS ? name : "unknown code";
}

#define EXPECT_CU(expected, expr) EXPECT_STREQ(Name(expected), Name(expr)) << #expr
#define ASSERT_CU(expected, expr) ASSERT_STREQ(Name(expected), Name(expr)) << #expr

CUmemAllocationProp DeviceProp(int device, bool exportable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes =
      exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

CUmemAccessDesc ReadWrite(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// Every test runs in device 0's primary context, retained and current.
class Standin : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(CUDA_SUCCESS, d().Init(0));
    ASSERT_CU(CUDA_SUCCESS, d().DevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(CUDA_SUCCESS, d().CtxPushCurrent(ctx_));
    baseline_ = BytesInUse(0);
  }
  void TearDown() override {
    CUcontext popped = nullptr;
    EXPECT_CU(CUDA_SUCCESS, d().CtxPopCurrent(&popped));
    EXPECT_CU(CUDA_SUCCESS, d().DevicePrimaryCtxRelease(0));
    EXPECT_EQ(BytesInUse(0), baseline_) << "the test left device memory alive";
  }

  static const CudaDriver& d() { return Driver(); }

  CUmemGenericAllocationHandle Create(size_t bytes = kChunk, bool exportable = true) {
    const CUmemAllocationProp prop = DeviceProp(0, exportable);
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU(CUDA_SUCCESS, d().MemCreate(&h, bytes, &prop, 0));
    return h;
  }
  CUdeviceptr Reserve(size_t bytes) {
    CUdeviceptr va = 0;
    EXPECT_CU(CUDA_SUCCESS, d().MemAddressReserve(&va, bytes, 0, 0, 0));
    return va;
  }
  // Maps `h` at `va` and makes it readable and writable for device 0.
  void MapReadWrite(CUdeviceptr va, CUmemGenericAllocationHandle h, size_t bytes = kChunk) {
    ASSERT_CU(CUDA_SUCCESS, d().MemMap(va, bytes, 0, h, 0));
    const CUmemAccessDesc access = ReadWrite(0);
    ASSERT_CU(CUDA_SUCCESS, d().MemSetAccess(va, bytes, &access, 1));
  }

  CUcontext ctx_ = nullptr;
  long long baseline_ = 0;
};

// ---- Descriptor passing for the cross-process tests -------------------------------------------
// The project's descriptor socket (common/descriptor_socket.h), one descriptor per packet.

inline void SendFd(int socket, int fd) {
  if (!SendPacket(socket, "f", {fd}).ok()) _exit(90);
}

// The descriptor of the next packet (the caller closes it), or -1.
inline int ReceiveFd(int socket) {
  auto packet = ReceivePacket(socket);
  if (!packet.ok() || packet->fds.size() != 1) return -1;
  return packet->fds[0].release();
}

inline int WaitExitCode(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace stash::standin_test

#endif  // STASH_TESTS_CUDA_STANDIN_STANDIN_TEST_FIXTURE_H_

// Tests of the CUDA driver stand-in (tests/cuda_standin, a TEST AID, never a backend): loaded
// through the project's driver table (common/cuda_driver.h) like the real libcuda, each contract
// it enforces is shown refusing, faulting or keeping memory alive as the driver documents.
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
#include "standin.h"

namespace stash {
namespace {

constexpr size_t kChunk = size_t{2} << 20;  // the stand-in's granularity

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

[[maybe_unused]] ::testing::Environment* const kRegistryEnvironment =
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

void SendFd(int socket, int fd) {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(socket, &msg, 0) != 1) _exit(90);
}

int ReceiveFd(int socket) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(socket, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

int WaitExitCode(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- Loading, initialization, devices and contexts
// ------------------------------------------------

TEST(CudaStandin, EveryEntryPointOfTheDriverTableResolves) {
  auto driver = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
}

TEST(CudaStandin, CallsBeforeCuInitAreNotInitialized) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: nothing called cuInit
  EXPECT_EXIT(
      {
        int count = 0;
        const bool refused = Driver().DeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED;
        const CUmemAllocationProp prop = DeviceProp(0, false);
        CUmemGenericAllocationHandle h = 0;
        const bool create_refused =
            Driver().MemCreate(&h, kChunk, &prop, 0) == CUDA_ERROR_NOT_INITIALIZED;
        _exit(refused && create_refused && Driver().Init(0) == CUDA_SUCCESS ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "cuInit\\(0\\) has not been called");
}

TEST_F(Standin, DevicesAttributesUuidsAndPeerAccessFollowTheEnvironment) {
  setenv("STASH_STANDIN_DEVICES", "3", 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  int count = 0;
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetCount(&count));
  EXPECT_EQ(count, 3);
  CUdevice dev = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, d().DeviceGet(&dev, 3));
  int value = 0;
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetAttribute(
                              &value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 2));
  EXPECT_EQ(value, 1);
  EXPECT_CU(CUDA_SUCCESS,
            d().DeviceGetAttribute(
                &value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  EXPECT_EQ(value, 1);
  EXPECT_CU(CUDA_SUCCESS,
            d().DeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  EXPECT_EQ(value, 9);
  CUuuid a{};
  CUuuid a_again{};
  CUuuid b{};
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetUuid(&a, 0));
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetUuid(&a_again, 0));
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetUuid(&b, 1));
  EXPECT_EQ(std::memcmp(a.bytes, a_again.bytes, sizeof(a.bytes)), 0);
  EXPECT_NE(std::memcmp(a.bytes, b.bytes, sizeof(a.bytes)), 0);
  int peer = 0;
  EXPECT_CU(CUDA_SUCCESS, d().DeviceCanAccessPeer(&peer, 0, 1));
  EXPECT_EQ(peer, 1);

  setenv("STASH_STANDIN_NO_PEER", "1", 1);
  setenv("STASH_STANDIN_NO_VMM", "1", 1);
  setenv("STASH_STANDIN_NO_POSIX_FD", "1", 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  EXPECT_CU(CUDA_SUCCESS, d().DeviceCanAccessPeer(&peer, 0, 1));
  EXPECT_EQ(peer, 0);
  EXPECT_CU(CUDA_SUCCESS, d().DeviceGetAttribute(
                              &value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(value, 0);
  const CUmemAllocationProp prop = DeviceProp(0, false);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, d().MemCreate(&h, kChunk, &prop, 0));
  unsetenv("STASH_STANDIN_NO_VMM");
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  const CUmemAllocationProp exportable = DeviceProp(0, true);
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, d().MemCreate(&h, kChunk, &exportable, 0));
  unsetenv("STASH_STANDIN_NO_PEER");
  unsetenv("STASH_STANDIN_NO_POSIX_FD");
  unsetenv("STASH_STANDIN_DEVICES");
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
}

TEST_F(Standin, CallsThatNeedAContextFailWithoutOne) {
  CUcontext popped = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().CtxPopCurrent(&popped));
  EXPECT_EQ(popped, ctx_);
  CUstream stream = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  size_t free = 0;
  size_t total = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().MemGetInfo(&free, &total));
  CUevent event = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().EventCreate(&event, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().CtxPopCurrent(&popped));
  // A released primary context is no context either.
  CUcontext other = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().DevicePrimaryCtxRetain(&other, 1));
  ASSERT_CU(CUDA_SUCCESS, d().CtxSetCurrent(other));
  ASSERT_CU(CUDA_SUCCESS, d().DevicePrimaryCtxRelease(1));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().StreamCreate(&stream, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, d().DevicePrimaryCtxRelease(1));
  ASSERT_CU(CUDA_SUCCESS, d().CtxSetCurrent(ctx_));  // back for TearDown
}

TEST_F(Standin, EveryCodeItReturnsHasANameAndADescription) {
  for (CUresult code :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_CAPTURED_EVENT,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD}) {
    const char* name = nullptr;
    const char* text = nullptr;
    EXPECT_EQ(d().GetErrorName(code, &name), CUDA_SUCCESS) << code;
    EXPECT_EQ(d().GetErrorString(code, &text), CUDA_SUCCESS) << code;
    EXPECT_NE(name, nullptr);
    EXPECT_NE(text, nullptr);
  }
  const char* name = "not reset";
  EXPECT_EQ(d().GetErrorName(static_cast<CUresult>(12345), &name), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(name, nullptr);
  // The table's own check names the call and the error.
  const Status status = d().Check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(&h, n, &prop, 0)");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos);
}

// ---- Virtual memory management
// ---------------------------------------------------------------------

TEST_F(Standin, CreateRefusesSizesOffTheGranularityAndUnsupportedProperties) {
  size_t granularity = 0;
  CUmemAllocationProp prop = DeviceProp(0, false);
  EXPECT_CU(CUDA_SUCCESS,
            d().MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(granularity, kChunk);
  EXPECT_CU(CUDA_SUCCESS, d().MemGetAllocationGranularity(&granularity, &prop,
                                                          CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(granularity, kChunk);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemCreate(&h, kChunk + 4096, &prop, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemCreate(&h, 0, &prop, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemCreate(&h, kChunk, &prop, 1));
  prop.location.id = 7;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, d().MemCreate(&h, kChunk, &prop, 0));
  prop = DeviceProp(0, false);
  prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemCreate(&h, kChunk, &prop, 0));
  // Export needs POSIX_FILE_DESCRIPTOR in requestedHandleTypes at creation.
  h = Create(kChunk, /*exportable=*/false);
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            d().MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemRelease(h));  // twice
}

TEST_F(Standin, MapRefusesNonZeroOffsetsUnalignedRangesAndMappedOrForeignRanges) {
  const CUmemGenericAllocationHandle h = Create(2 * kChunk);
  const CUdeviceptr va = Reserve(4 * kChunk);
  EXPECT_EQ(va % kChunk, 0U);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va, kChunk, kChunk, h, 0));    // offset
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va + 4096, kChunk, 0, h, 0));  // ptr
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va, kChunk + 4096, 0, h, 0));  // size
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va, 3 * kChunk, 0, h, 0));     // > allocation
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va + 3 * kChunk, 2 * kChunk, 0, h, 0));  // out
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va, 2 * kChunk, 0, h, 1));               // flags
  ASSERT_CU(CUDA_SUCCESS, d().MemMap(va, 2 * kChunk, 0, h, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va + kChunk, 2 * kChunk, 0, h, 0));  // mapped
  // Access and unmap take whole mappings only.
  const CUmemAccessDesc access = ReadWrite(0);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemSetAccess(va, kChunk, &access, 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemSetAccess(va, 3 * kChunk, &access, 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemUnmap(va, kChunk));
  // The reservation cannot go while mapped, nor with another size.
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemAddressFree(va, 4 * kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemUnmap(va, 2 * kChunk));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemAddressFree(va, 2 * kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, 4 * kChunk));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemMap(va, 2 * kChunk, 0, h, 0));  // freed reservation
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(h));
  CUdeviceptr bad = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().MemAddressReserve(&bad, kChunk, 3 * 4096, 0, 0));
}

TEST_F(Standin, ATouchBeforeSetAccessOrAfterUnmapFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUmemGenericAllocationHandle h = Create();
  const CUdeviceptr va = Reserve(kChunk);
  ASSERT_CU(CUDA_SUCCESS, d().MemMap(va, kChunk, 0, h, 0));
  auto* bytes = At<volatile unsigned char>(va);
  EXPECT_EXIT(bytes[0] = 1, ::testing::KilledBySignal(SIGSEGV), "");
  const CUmemAccessDesc access = ReadWrite(0);
  ASSERT_CU(CUDA_SUCCESS, d().MemSetAccess(va, kChunk, &access, 1));
  bytes[0] = 1;
  bytes[kChunk - 1] = 2;
  EXPECT_EQ(bytes[0] + bytes[kChunk - 1], 3);
  ASSERT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_EXIT(bytes[0] = 1, ::testing::KilledBySignal(SIGSEGV), "");
  // Mapped again, the range starts without access once more.
  ASSERT_CU(CUDA_SUCCESS, d().MemMap(va, kChunk, 0, h, 0));
  EXPECT_EXIT((void)bytes[0], ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(h));
}

TEST_F(Standin, ReleaseKeepsMemoryAliveWhileMappedAndFreesItAtTheLastUnmap) {
  const CUmemGenericAllocationHandle h = Create();
  const CUdeviceptr va = Reserve(kChunk);
  MapReadWrite(va, h);
  std::memset(At(va), 0x5a, kChunk);
  ASSERT_CU(CUDA_SUCCESS, d().MemRelease(h));
  EXPECT_EQ(BytesInUse(0), baseline_ + static_cast<long long>(kChunk));
  const auto* bytes = At<const unsigned char>(va);
  EXPECT_EQ(bytes[0], 0x5a);
  EXPECT_EQ(bytes[kChunk - 1], 0x5a);
  size_t free = 0;
  size_t total = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemGetInfo(&free, &total));
  EXPECT_EQ(total - free, static_cast<size_t>(baseline_) + kChunk);
  ASSERT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_EQ(BytesInUse(0), baseline_);
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, kChunk));
}

TEST_F(Standin, ExportedChunksShareBytesWithAForkedImporter) {
  const CUmemGenericAllocationHandle h = Create();
  int fd = -1;
  ASSERT_CU(CUDA_SUCCESS,
            d().MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The importer: its own handle and mapping of the same memory, written.
    CUmemGenericAllocationHandle imported = 0;
    CUdeviceptr va = 0;
    const CUmemAccessDesc access = ReadWrite(0);
    if (d().MemImportFromShareableHandle(
            &imported, OsHandle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        d().MemAddressReserve(&va, kChunk, 0, 0, 0) != CUDA_SUCCESS ||
        d().MemMap(va, kChunk, 0, imported, 0) != CUDA_SUCCESS ||
        d().MemSetAccess(va, kChunk, &access, 1) != CUDA_SUCCESS) {
      _exit(1);
    }
    std::memset(At(va), 0x3c, kChunk);
    _exit(d().MemUnmap(va, kChunk) == CUDA_SUCCESS && d().MemRelease(imported) == CUDA_SUCCESS ? 0
                                                                                               : 2);
  }
  ASSERT_EQ(WaitExitCode(child), 0);
  close(fd);
  const CUdeviceptr va = Reserve(kChunk);
  MapReadWrite(va, h);
  const auto* bytes = At<const unsigned char>(va);
  EXPECT_EQ(bytes[0], 0x3c);
  EXPECT_EQ(bytes[kChunk / 2], 0x3c);
  EXPECT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(h));
  // Something that is not an exported allocation is refused.
  CUmemGenericAllocationHandle junk = 0;
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED,
            d().MemImportFromShareableHandle(&junk, OsHandle(devnull),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(devnull);
}

TEST_F(Standin, AnImportedChunkOutlivesItsExportersSigkillAndIsFreedAtItsLastRelease) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  const pid_t exporter = fork();
  ASSERT_GE(exporter, 0);
  if (exporter == 0) {
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    int fd = -1;
    const CUmemAllocationProp prop = DeviceProp(0, true);
    const CUmemAccessDesc access = ReadWrite(0);
    if (d().MemCreate(&h, kChunk, &prop, 0) != CUDA_SUCCESS ||
        d().MemAddressReserve(&va, kChunk, 0, 0, 0) != CUDA_SUCCESS ||
        d().MemMap(va, kChunk, 0, h, 0) != CUDA_SUCCESS ||
        d().MemSetAccess(va, kChunk, &access, 1) != CUDA_SUCCESS ||
        d().MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
            CUDA_SUCCESS) {
      _exit(1);
    }
    std::memset(At(va), 0x77, kChunk);
    SendFd(sockets[1], fd);
    for (;;) pause();  // holds its handle and mapping until killed
  }
  const int fd = ReceiveFd(sockets[0]);
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemImportFromShareableHandle(
                              &imported, OsHandle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  ASSERT_EQ(kill(exporter, SIGKILL), 0);
  EXPECT_EQ(WaitExitCode(exporter), 128 + SIGKILL);
  close(sockets[0]);
  close(sockets[1]);
  // The exporter's references died with it; the import keeps the memory and its bytes.
  EXPECT_EQ(BytesInUse(0), baseline_ + static_cast<long long>(kChunk));
  const CUdeviceptr va = Reserve(kChunk);
  MapReadWrite(va, imported);
  EXPECT_EQ(At<const unsigned char>(va)[kChunk - 1], 0x77);
  ASSERT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_EQ(BytesInUse(0), baseline_ + static_cast<long long>(kChunk));  // the handle holds it
  ASSERT_CU(CUDA_SUCCESS, d().MemRelease(imported));
  EXPECT_EQ(BytesInUse(0), baseline_);
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, kChunk));
}

// A child that creates `chunks` chunks on device 0, says so on `ready` and holds them until
// killed.
pid_t HoldChunksInAChild(int chunks, int* ready_fd) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    const CUmemAllocationProp prop = DeviceProp(0, false);
    for (int i = 0; i < chunks; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (Driver().MemCreate(&h, kChunk, &prop, 0) != CUDA_SUCCESS) _exit(1);
    }
    const char byte = 'r';
    if (write(pipe_fds[1], &byte, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(pipe_fds[1]);
  *ready_fd = pipe_fds[0];
  return child;
}

TEST_F(Standin, TheBudgetCountsEveryProcessesLiveMemoryAndRefusesCreatesOverIt) {
  ASSERT_EQ(baseline_, 0);
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(4 * kChunk).c_str(), 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  int ready = -1;
  const pid_t holder = HoldChunksInAChild(3, &ready);
  ASSERT_GT(holder, 0);
  char byte = 0;
  ASSERT_EQ(read(ready, &byte, 1), 1);
  close(ready);
  size_t free = 0;
  size_t total = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemGetInfo(&free, &total));
  EXPECT_EQ(total, 4 * kChunk);
  EXPECT_EQ(free, kChunk);
  const CUmemGenericAllocationHandle mine = Create();
  const CUmemAllocationProp prop = DeviceProp(0, false);
  CUmemGenericAllocationHandle over = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, d().MemCreate(&over, kChunk, &prop, 0));
  // Another device has its own budget.
  const CUmemAllocationProp other = DeviceProp(1, false);
  ASSERT_CU(CUDA_SUCCESS, d().MemCreate(&over, kChunk, &other, 0));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(over));
  // The holder's death frees its memory, as the driver does for a killed process.
  ASSERT_EQ(kill(holder, SIGKILL), 0);
  EXPECT_EQ(WaitExitCode(holder), 128 + SIGKILL);
  ASSERT_CU(CUDA_SUCCESS, d().MemCreate(&over, kChunk, &prop, 0));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(over));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(mine));
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(32 * kChunk).c_str(), 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
}

TEST_F(Standin, RenewingAChunkAHolderStillMapsIsCaughtByTheBudget) {
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(2 * kChunk).c_str(), 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  // The "daemon" leases two chunks to a "rank" that maps one of them and keeps it mapped.
  const CUmemGenericAllocationHandle a = Create();
  const CUmemGenericAllocationHandle b = Create();
  int fd = -1;
  ASSERT_CU(CUDA_SUCCESS,
            d().MemExportToShareableHandle(&fd, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int sync_fds[2];
  ASSERT_EQ(pipe(sync_fds), 0);
  const pid_t rank = fork();
  ASSERT_GE(rank, 0);
  if (rank == 0) {
    CUmemGenericAllocationHandle imported = 0;
    CUdeviceptr va = 0;
    if (d().MemImportFromShareableHandle(
            &imported, OsHandle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        d().MemAddressReserve(&va, kChunk, 0, 0, 0) != CUDA_SUCCESS ||
        d().MemMap(va, kChunk, 0, imported, 0) != CUDA_SUCCESS ||
        d().MemRelease(imported) != CUDA_SUCCESS) {
      _exit(1);
    }
    close(fd);
    const char byte = 'm';
    if (write(sync_fds[1], &byte, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(fd);
  char byte = 0;
  ASSERT_EQ(read(sync_fds[0], &byte, 1), 1);
  // The daemon drops chunk a and asks for fresh memory in its place: the rank's mapping still
  // holds a, so the device has no room.
  ASSERT_CU(CUDA_SUCCESS, d().MemRelease(a));
  const CUmemAllocationProp prop = DeviceProp(0, true);
  CUmemGenericAllocationHandle renewed = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, d().MemCreate(&renewed, kChunk, &prop, 0));
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  EXPECT_EQ(WaitExitCode(rank), 128 + SIGKILL);
  ASSERT_CU(CUDA_SUCCESS, d().MemCreate(&renewed, kChunk, &prop, 0));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(renewed));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(b));
  close(sync_fds[0]);
  close(sync_fds[1]);
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(32 * kChunk).c_str(), 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
}

// ---- Streams, events, kernels -------------------------------------------------------------------

std::mutex g_appended_mu;
std::vector<int>& Appended() {
  static auto* appended = new std::vector<int>();
  return *appended;
}

// Twin of a kernel `append(int value)`: records the order kernels ran in.
void AppendTwin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  int value = 0;
  std::memcpy(&value, params[0], sizeof(value));
  std::lock_guard<std::mutex> lock(g_appended_mu);
  Appended().push_back(value);
}

// Twin of a kernel `add(uint64_t* counter, uint64_t value)`.
void AddTwin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  uint64_t* counter = nullptr;
  uint64_t value = 0;
  std::memcpy(&counter, params[0], sizeof(counter));
  std::memcpy(&value, params[1], sizeof(value));
  __atomic_fetch_add(counter, value, __ATOMIC_SEQ_CST);
}

std::vector<int> AppendedSoFar() {
  std::lock_guard<std::mutex> lock(g_appended_mu);
  return Appended();
}

class Streams : public Standin {
 protected:
  void SetUp() override {
    Standin::SetUp();
    RegisterKernel("append", &AppendTwin, {sizeof(int)});
    RegisterKernel("add", &AddTwin, {sizeof(uint64_t*), sizeof(uint64_t)});
    static const unsigned char kImage[16] = {};
    ASSERT_CU(CUDA_SUCCESS, d().ModuleLoadData(&module_, kImage));
    ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&append_, module_, "append"));
    ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&add_, module_, "add"));
    ASSERT_CU(CUDA_SUCCESS, d().StreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(CUDA_SUCCESS, d().MemHostRegister(words_, sizeof(words_), 0));
    std::lock_guard<std::mutex> lock(g_appended_mu);
    Appended().clear();
  }
  void TearDown() override {
    EXPECT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
    EXPECT_CU(CUDA_SUCCESS, d().StreamDestroy(stream_));
    EXPECT_CU(CUDA_SUCCESS, d().MemHostUnregister(words_));
    EXPECT_CU(CUDA_SUCCESS, d().ModuleUnload(module_));
    Standin::TearDown();
  }

  CUresult Append(int value, CUstream stream) {
    void* params[] = {&value};
    return d().LaunchKernel(append_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
  }
  CUresult Add(uint64_t* counter, uint64_t value, CUstream stream) {
    void* params[] = {&counter, &value};
    return d().LaunchKernel(add_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
  }
  // A gate the stream waits on: work after it runs once the test opens it.
  CUresult WaitForGate(CUstream stream) {
    return d().StreamWaitValue64(stream, Device(&words_[0]), 1, CU_STREAM_WAIT_VALUE_GEQ);
  }
  void OpenGate() { __atomic_store_n(&words_[0], uint64_t{1}, __ATOMIC_SEQ_CST); }
  CUdeviceptr Device(uint64_t* word) {
    CUdeviceptr p = 0;
    EXPECT_CU(CUDA_SUCCESS, d().MemHostGetDevicePointer(&p, word, 0));
    return p;
  }

  CUmodule module_ = nullptr;
  CUfunction append_ = nullptr;
  CUfunction add_ = nullptr;
  CUstream stream_ = nullptr;
  alignas(8) uint64_t words_[4] = {};  // [0] the gate, [1] a counter the stream writes
};

TEST_F(Streams, WorkRunsInOrderAfterItsWaitAndEventsCompleteAfterIt) {
  CUevent done = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().EventCreate(&done, CU_EVENT_DISABLE_TIMING));
  EXPECT_CU(CUDA_SUCCESS, d().EventQuery(done));  // never recorded
  ASSERT_CU(CUDA_SUCCESS, WaitForGate(stream_));
  for (int i = 0; i < 5; ++i) ASSERT_CU(CUDA_SUCCESS, Append(i, stream_));
  ASSERT_TRUE(d().WriteValueAfterBarrier(stream_, Device(&words_[1]), 42).ok());
  ASSERT_CU(CUDA_SUCCESS, d().EventRecord(done, stream_));
  EXPECT_CU(CUDA_ERROR_NOT_READY, d().EventQuery(done));
  EXPECT_TRUE(AppendedSoFar().empty());
  EXPECT_EQ(__atomic_load_n(&words_[1], __ATOMIC_SEQ_CST), 0U);
  OpenGate();
  ASSERT_CU(CUDA_SUCCESS, d().EventSynchronize(done));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(__atomic_load_n(&words_[1], __ATOMIC_SEQ_CST), 42U);
  EXPECT_CU(CUDA_SUCCESS, d().EventQuery(done));
  EXPECT_CU(CUDA_SUCCESS, d().EventDestroy(done));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, d().EventDestroy(done));
}

TEST_F(Streams, WorkIsDeferredByDefaultAndRunsAtEnqueueWhenImmediate) {
  ASSERT_CU(CUDA_SUCCESS, Append(1, stream_));
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{1}));
  setenv("STASH_STANDIN_STREAMS", "immediate", 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  ASSERT_CU(CUDA_SUCCESS, Append(2, stream_));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{1, 2}));  // before any synchronization
  unsetenv("STASH_STANDIN_STREAMS");
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
}

TEST_F(Streams, MemoryUnmappedBeforeItsQueuedWorkRanFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUmemGenericAllocationHandle h = Create();
  const CUdeviceptr va = Reserve(kChunk);
  MapReadWrite(va, h);
  EXPECT_EXIT(
      {
        // The memset is queued behind the gate; the unmap comes before it runs.
        if (WaitForGate(stream_) != CUDA_SUCCESS ||
            d().MemsetD8Async(va, 0xff, kChunk, stream_) != CUDA_SUCCESS ||
            d().MemUnmap(va, kChunk) != CUDA_SUCCESS) {
          _exit(1);
        }
        OpenGate();
        d().StreamSynchronize(stream_);
        _exit(0);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  // Work that runs while the memory is mapped and accessible is fine.
  ASSERT_CU(CUDA_SUCCESS, d().MemsetD8Async(va, 0xab, kChunk, stream_));
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(At<const unsigned char>(va)[kChunk - 1], 0xab);
  // Addresses that are no device memory are refused when enqueued.
  std::vector<unsigned char> heap(64);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            d().MemsetD8Async(reinterpret_cast<CUdeviceptr>(heap.data()), 0, heap.size(), stream_));
  EXPECT_CU(CUDA_SUCCESS, d().MemUnmap(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemAddressFree(va, kChunk));
  EXPECT_CU(CUDA_SUCCESS, d().MemRelease(h));
}

TEST_F(Streams, AWaitThatIsNeverSatisfiedFailsLoudlyInsteadOfHanging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child needs its stream's worker thread
  setenv("STASH_STANDIN_WAIT_TIMEOUT_MS", "200", 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  EXPECT_DEATH(
      {
        WaitForGate(stream_);
        d().StreamSynchronize(stream_);
      },
      "was never satisfied within 200 ms");
  unsetenv("STASH_STANDIN_WAIT_TIMEOUT_MS");
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
}

TEST_F(Streams, UnknownKernelsAreNotFoundAndLaunchesNeedAContextAndALiveModule) {
  CUfunction f = nullptr;
  EXPECT_CU(CUDA_ERROR_NOT_FOUND, d().ModuleGetFunction(&f, module_, "no_such_kernel"));
  CUcontext popped = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().CtxPopCurrent(&popped));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, Append(1, stream_));
  ASSERT_CU(CUDA_SUCCESS, d().CtxPushCurrent(popped));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            d().LaunchKernel(append_, 1, 1, 1, 2048, 1, 1, 0, stream_, nullptr, nullptr));
  CUmodule second = nullptr;
  static const unsigned char kImage[16] = {};
  ASSERT_CU(CUDA_SUCCESS, d().ModuleLoadData(&second, kImage));
  ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&f, second, "append"));
  ASSERT_CU(CUDA_SUCCESS, d().ModuleUnload(second));
  int value = 1;
  void* params[] = {&value};
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE,
            d().LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr));
}

// ---- Capture and graphs -------------------------------------------------------------------------

TEST_F(Streams, CaptureRecordsInsteadOfRunningAndEveryReplayRunsTheKernelAgain) {
  uint64_t counter = 0;
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(stream_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_CU(CUDA_SUCCESS, Add(&counter, 5, stream_));  // its parameters are copied now
  ASSERT_CU(CUDA_SUCCESS, Append(7, stream_));
  CUgraph graph = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().StreamEndCapture(stream_, &graph));
  ASSERT_NE(graph, nullptr);
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(counter, 0U);
  EXPECT_TRUE(AppendedSoFar().empty());
  CUgraphExec exec = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().GraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) ASSERT_CU(CUDA_SUCCESS, d().GraphLaunch(exec, stream_));
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(__atomic_load_n(&counter, __ATOMIC_SEQ_CST), 15U);
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{7, 7, 7}));
  EXPECT_CU(CUDA_SUCCESS, d().GraphExecDestroy(exec));
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().GraphLaunch(exec, stream_));
}

TEST_F(Streams, SynchronizingACapturingStreamFailsAndInvalidatesTheCapture) {
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(CUDA_SUCCESS, Append(1, stream_));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d().StreamSynchronize(stream_));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(stream_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, Append(2, stream_));
  auto* graph = reinterpret_cast<CUgraph>(&status);  // must come back NULL
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(stream_, &graph));
  EXPECT_EQ(graph, nullptr);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, d().StreamEndCapture(stream_, &graph));
  // Out of capture mode, the stream works again; nothing captured ever ran.
  ASSERT_CU(CUDA_SUCCESS, Append(3, stream_));
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{3}));
}

TEST_F(Streams, AnEventLastRecordedInACaptureCannotBeQueriedInAnyMode) {
  CUevent event = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().EventCreate(&event, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(CUDA_SUCCESS, d().EventRecord(event, stream_));
  EXPECT_CU(CUDA_ERROR_CAPTURED_EVENT, d().EventQuery(event));
  EXPECT_CU(CUDA_ERROR_CAPTURED_EVENT, d().EventSynchronize(event));
  CUgraph graph = nullptr;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(stream_, &graph));
  EXPECT_CU(CUDA_SUCCESS, d().EventQuery(event));  // capture over: no pending recording
  EXPECT_CU(CUDA_SUCCESS, d().EventDestroy(event));
}

TEST_F(Streams, GlobalCaptureProhibitsUnsafeCallsOnEveryThreadThreadLocalOnlyOnItsOwn) {
  CUevent event = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().EventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CUcontext ctx = ctx_;
  auto query_on_another_thread = [&] {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread([&] {
      d().CtxSetCurrent(ctx);
      r = d().EventQuery(event);
    }).join();
    return r;
  };
  CUgraph graph = nullptr;
  // Global: another thread's event query is refused and invalidates the capture.
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, query_on_another_thread());
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(stream_, &graph));
  // Thread-local: other threads may; the capturing thread may not.
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_CU(CUDA_SUCCESS, query_on_another_thread());
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(stream_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d().EventQuery(event));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(stream_, &graph));
  // Relaxed: nobody is prohibited.
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_SUCCESS, d().EventQuery(event));
  EXPECT_CU(CUDA_SUCCESS, query_on_another_thread());
  ASSERT_CU(CUDA_SUCCESS, d().StreamEndCapture(stream_, &graph));
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  EXPECT_CU(CUDA_SUCCESS, d().EventDestroy(event));
}

TEST_F(Streams, AThreadInRelaxedInteractionModeMayCallDuringAnotherThreadsGlobalCapture) {
  CUevent event = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().EventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CUcontext ctx = ctx_;
  CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  auto query_on_another_thread = [&](CUstreamCaptureMode mode) {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread([&] {
      d().CtxSetCurrent(ctx);
      CUstreamCaptureMode exchanged = mode;
      if (d().ThreadExchangeStreamCaptureMode(&exchanged) != CUDA_SUCCESS) return;
      r = d().EventQuery(event);
      thread_mode = exchanged;  // the mode the thread had before: the default
    }).join();
    return r;
  };
  CUgraph graph = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_SUCCESS, query_on_another_thread(CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(thread_mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_CU(CUDA_SUCCESS, query_on_another_thread(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ASSERT_CU(CUDA_SUCCESS, d().StreamEndCapture(stream_, &graph));  // not invalidated
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  CUstreamCaptureMode bad = static_cast<CUstreamCaptureMode>(7);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, d().ThreadExchangeStreamCaptureMode(&bad));
  EXPECT_CU(CUDA_SUCCESS, d().EventDestroy(event));
}

TEST_F(Streams, OnlyARelaxedCaptureMayEndOnAnotherThread) {
  CUgraph graph = nullptr;
  auto end_on_another_thread = [&] {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread([&] { r = d().StreamEndCapture(stream_, &graph); }).join();
    return r;
  };
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, end_on_another_thread());
  ASSERT_CU(CUDA_SUCCESS, d().StreamEndCapture(stream_, &graph));
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(CUDA_SUCCESS, end_on_another_thread());
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            d().StreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

TEST_F(Streams, TheLegacyStreamIsUnusableWhileABlockingStreamCaptures) {
  CUstream blocking = nullptr;
  ASSERT_CU(CUDA_SUCCESS, d().StreamCreate(&blocking, CU_STREAM_DEFAULT));
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, d().StreamIsCapturing(nullptr, &status));
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(blocking, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);  // the query does not invalidate
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, Append(1, CU_STREAM_LEGACY));
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(blocking, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);  // the use does
  CUgraph graph = nullptr;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(blocking, &graph));
  // A non-blocking stream's capture leaves the legacy stream usable.
  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_SUCCESS, Append(2, nullptr));
  ASSERT_CU(CUDA_SUCCESS, d().StreamEndCapture(stream_, &graph));
  EXPECT_CU(CUDA_SUCCESS, d().GraphDestroy(graph));
  EXPECT_CU(CUDA_SUCCESS, d().StreamSynchronize(nullptr));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{2}));
  EXPECT_CU(CUDA_SUCCESS, d().StreamDestroy(blocking));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, d().StreamDestroy(blocking));
}

}  // namespace
}  // namespace stash

// Tests of the CUDA driver stand-in (tests/cuda_standin, a TEST AID, never a backend): loaded
// through the project's driver table (common/cuda_driver.h) like the real libcuda, each contract
// it enforces is shown refusing, faulting or keeping memory alive as the driver documents.
#include "standin_test_fixture.h"

namespace stash::standin_test {
namespace {

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

}  // namespace
}  // namespace stash::standin_test

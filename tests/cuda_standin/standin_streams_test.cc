// Tests of the CUDA driver stand-in's streams, events, kernels, capture and graphs (tests/
// cuda_standin, a TEST AID, never a backend): work runs late and in order, and every call a
// capture prohibits is refused as the driver documents.
#include "standin_test_fixture.h"

namespace stash::standin_test {
namespace {

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

// Twin of a kernel `load(const uint64_t* from, uint64_t* to)`: what `from` holds when it runs.
void LoadTwin(void** params, unsigned /*grid_x*/, unsigned /*block_x*/) {
  const uint64_t* from = nullptr;
  uint64_t* to = nullptr;
  std::memcpy(&from, params[0], sizeof(from));
  std::memcpy(&to, params[1], sizeof(to));
  __atomic_store_n(to, __atomic_load_n(from, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
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
    RegisterKernel("load", &LoadTwin, {sizeof(uint64_t*), sizeof(uint64_t*)});
    static const unsigned char kImage[16] = {};
    ASSERT_CU(CUDA_SUCCESS, d().ModuleLoadData(&module_, kImage));
    ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&append_, module_, "append"));
    ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&add_, module_, "add"));
    ASSERT_CU(CUDA_SUCCESS, d().ModuleGetFunction(&load_, module_, "load"));
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
  CUresult Load(CUdeviceptr from, uint64_t* to, CUstream stream) {
    void* params[] = {&from, &to};
    return d().LaunchKernel(load_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
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
  CUfunction load_ = nullptr;
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

// The Driver API's "API synchronization behavior": cuMemcpyHtoD from pageable memory may return
// before its bytes land, on the legacy stream; a non-blocking stream does not wait for it, a
// blocking stream and cuMemcpyDtoH do. From page-locked memory the copy is done at return.
TEST_F(Streams, APageableCopyLandsLateAndOnlyTheLegacyStreamAndBlockingStreamsWaitForIt) {
  // Long delays, so that the order below holds on a loaded machine: stream work runs 200 ms after
  // its enqueue, the pageable copy's bytes land 600 ms after the call.
  CUdeviceptr word = 0;
  CUstream blocking = nullptr;
  struct Restore {  // however the test ends: the default delay back, the memory and stream freed
    CUdeviceptr* word;
    CUstream* blocking;
    ~Restore() {
      if (*blocking != nullptr) {
        EXPECT_CU(CUDA_SUCCESS, d().StreamDestroy(*blocking));
      }
      if (*word != 0) {
        EXPECT_CU(CUDA_SUCCESS, d().MemFree(*word));
      }
      unsetenv("STASH_STANDIN_STREAM_DELAY_US");
      EXPECT_CU(CUDA_SUCCESS, d().Init(0));
    }
  } restore{&word, &blocking};
  setenv("STASH_STANDIN_STREAM_DELAY_US", "200000", 1);
  ASSERT_CU(CUDA_SUCCESS, d().Init(0));
  ASSERT_CU(CUDA_SUCCESS, d().MemAlloc(&word, sizeof(uint64_t)));
  *At<uint64_t>(word) = 0;
  ASSERT_CU(CUDA_SUCCESS, d().StreamCreate(&blocking, 0));

  const uint64_t seven = 7;  // pageable: on this thread's stack
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyHtoD(word, &seven, sizeof(seven)));
  ASSERT_CU(CUDA_SUCCESS, Load(word, &words_[1], stream_));   // non-blocking: reads 0
  ASSERT_CU(CUDA_SUCCESS, Load(word, &words_[2], blocking));  // blocking: after the copy
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_EQ(__atomic_load_n(&words_[1], __ATOMIC_SEQ_CST), 0U);
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(blocking));
  EXPECT_EQ(__atomic_load_n(&words_[2], __ATOMIC_SEQ_CST), 7U);

  const uint64_t nine = 9;
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyHtoD(word, &nine, sizeof(nine)));
  uint64_t back = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyDtoH(&back, word, sizeof(back)));  // after it, in order
  EXPECT_EQ(back, 9U);

  __atomic_store_n(&words_[3], uint64_t{11}, __ATOMIC_SEQ_CST);  // words_ is registered
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyHtoD(word, &words_[3], sizeof(uint64_t)));
  EXPECT_EQ(__atomic_load_n(At<uint64_t>(word), __ATOMIC_SEQ_CST), 11U);  // landed at return
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

// What the daemon's copy stream uses: a host function runs in stream order after the work
// before it and before the work after it; cuStreamQuery says NOT_READY until the stream's work
// is done (and, like synchronizing, invalidates a capture); cuMemcpyDtoHAsync to page-locked
// memory returns at once and copies in stream order, to pageable memory it returns done.
TEST_F(Streams, HostFunctionsQueriesAndAsynchronousCopiesBackRunInStreamOrder) {
  ASSERT_CU(CUDA_SUCCESS, WaitForGate(stream_));
  ASSERT_CU(CUDA_SUCCESS, Append(1, stream_));
  int two = 2;
  ASSERT_CU(CUDA_SUCCESS, d().LaunchHostFunc(
                              stream_,
                              [](void* value) {
                                std::lock_guard<std::mutex> lock(g_appended_mu);
                                Appended().push_back(*static_cast<int*>(value));
                              },
                              &two));
  ASSERT_CU(CUDA_SUCCESS, Append(3, stream_));
  EXPECT_CU(CUDA_ERROR_NOT_READY, d().StreamQuery(stream_));
  OpenGate();
  ASSERT_CU(CUDA_SUCCESS, d().StreamSynchronize(stream_));
  EXPECT_CU(CUDA_SUCCESS, d().StreamQuery(stream_));
  EXPECT_EQ(AppendedSoFar(), (std::vector<int>{1, 2, 3}));

  // The copy back: words_[1] is registered (page-locked), `pageable` is not.
  CUdeviceptr from = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemAlloc(&from, 8));
  const uint64_t value = 77;
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyHtoD(from, &value, 8));
  ASSERT_CU(CUDA_SUCCESS, d().CtxSynchronize());
  __atomic_store_n(&words_[0], uint64_t{0}, __ATOMIC_SEQ_CST);
  ASSERT_CU(CUDA_SUCCESS, WaitForGate(stream_));
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyDtoHAsync(&words_[1], from, 8, stream_));
  EXPECT_EQ(__atomic_load_n(&words_[1], __ATOMIC_SEQ_CST), 0U) << "page-locked: not yet";
  OpenGate();
  uint64_t pageable = 0;
  ASSERT_CU(CUDA_SUCCESS, d().MemcpyDtoHAsync(&pageable, from, 8, stream_));
  EXPECT_EQ(pageable, 77U) << "pageable: done at return";
  EXPECT_EQ(__atomic_load_n(&words_[1], __ATOMIC_SEQ_CST), 77U) << "and the earlier copy too";
  EXPECT_CU(CUDA_SUCCESS, d().MemFree(from));

  ASSERT_CU(CUDA_SUCCESS, d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d().StreamQuery(stream_));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(CUDA_SUCCESS, d().StreamIsCapturing(stream_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph graph = nullptr;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d().StreamEndCapture(stream_, &graph));
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
}  // namespace stash::standin_test

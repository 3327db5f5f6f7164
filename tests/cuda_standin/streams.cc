// TEST AID, NEVER A BACKEND (see standin.h): the stand-in's streams, events, stream memory
// operations, stream capture and graphs.
//
// Each stream has a worker thread that runs its work in order. By default work is deferred: an
// operation runs no earlier than STASH_STANDIN_STREAM_DELAY_US (2000) after it was enqueued, so
// code that frees, unmaps or reuses memory before its queued work completed faults or reads wrong
// bytes deterministically instead of passing by luck. STASH_STANDIN_STREAMS=immediate runs work
// on the enqueuing thread instead. A stream wait that stays unsatisfied for
// STASH_STANDIN_WAIT_TIMEOUT_MS (10000) aborts the process with a message (a GPU would hang).
//
// Capture (CUDA Driver API, Stream Management, cuStreamBeginCapture): "When a stream is in
// capture mode, all operations pushed into the stream will not be executed, but will instead be
// captured into a graph". A graph here is the list of captured operations, each holding copies
// of its parameters; cuGraphLaunch runs them in order on the launch stream, every replay alike.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "internal.h"
#include "stream_queue.h"

namespace standin {
namespace {

struct Capture {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<Op> nodes;
};

}  // namespace
}  // namespace standin

struct CUstream_st {
  int device = 0;
  unsigned flags = 0;
  bool legacy = false;  // the per-device default (NULL / CU_STREAM_LEGACY) stream
  std::shared_ptr<standin::Queue> queue;
  std::unique_ptr<standin::Capture> capture;  // guarded by standin::g_mu
};

namespace standin {
namespace {

// Completion of an event's recordings; shared with the operations that complete them.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // recordings enqueued
  uint64_t completed = 0;  // the highest recording a stream reached
};

}  // namespace
}  // namespace standin

struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<standin::EventState> state;
  CUstream_st* captured_in = nullptr;  // last recorded in this capturing stream (g_mu)
};

struct CUgraph_st {
  std::vector<standin::Op> nodes;
};

struct CUgraphExec_st {
  std::shared_ptr<const std::vector<standin::Op>> nodes;
};

namespace standin {
namespace {

std::mutex g_mu;  // live handles and capture state

template <typename T>
std::set<const T*>& Live() {
  static auto* live = new std::set<const T*>();
  return *live;
}

CUstream_st* DefaultStream(int device) {
  static auto* streams = new std::map<int, CUstream_st*>();
  CUstream_st*& s = (*streams)[device];
  if (s == nullptr) {
    s = new CUstream_st();
    s->device = device;
    s->legacy = true;
    s->queue = Queue::Start();
  }
  return s;
}

bool IsDefaultHandle(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

const char* ModeName(CUstreamCaptureMode mode) {
  switch (mode) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL:
      return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
      return "thread-local";
    case CU_STREAM_CAPTURE_MODE_RELAXED:
      return "relaxed";
  }
  return "unknown";
}

// Resolves a stream handle under g_mu. The default stream needs a current context.
CUresult Resolve(const char* fn, CUstream h, CUstream_st** out) {
  if (IsDefaultHandle(h)) {
    int device = 0;
    const CUresult ctx = CurrentDevice(fn, &device);
    if (ctx != CUDA_SUCCESS) return ctx;
    *out = DefaultStream(device);
    return CUDA_SUCCESS;
  }
  if (Live<CUstream_st>().count(h) == 0) {
    return Fail(CUDA_ERROR_INVALID_HANDLE, fn, "not a live stream (destroyed, or never created)");
  }
  *out = h;
  return CUDA_SUCCESS;
}

// CUDA Programming Guide, Stream Capture, "Prohibited and Unhandled Operations": "When any
// stream in the same context is being captured, and it was not created with
// cudaStreamNonBlocking, any attempted use of the legacy stream is invalid." Under g_mu; the
// capturing blocking streams of `device`.
std::vector<CUstream_st*> BlockingCaptures(int device) {
  std::vector<CUstream_st*> out;
  for (const CUstream_st* s : Live<CUstream_st>()) {
    auto* stream = const_cast<CUstream_st*>(s);
    if (stream->capture && stream->device == device &&
        (stream->flags & CU_STREAM_NON_BLOCKING) == 0) {
      out.push_back(stream);
    }
  }
  return out;
}

// CUDA Programming Guide, Stream Capture, "Invalidation": "When an invalid operation is
// attempted during stream capture, any associated capture graphs are invalidated ... further use
// of any streams which are being captured ... is invalid and will return an error, until stream
// capture is ended with cudaStreamEndCapture()".
void Invalidate(CUstream_st* s) {
  if (s->capture) s->capture->invalidated = true;
}

// The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode; GLOBAL by
// default).
thread_local CUstreamCaptureMode t_interaction = CU_STREAM_CAPTURE_MODE_GLOBAL;

// cuThreadExchangeStreamCaptureMode, by the thread's mode: GLOBAL (the default): "If the local
// thread has an ongoing capture sequence that was not initiated with
// CU_STREAM_CAPTURE_MODE_RELAXED at cuStreamBeginCapture, or if any other thread has a concurrent
// capture sequence initiated with CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from
// potentially unsafe API calls." THREAD_LOCAL: only the local thread's own capture counts
// ("Concurrent capture sequences in other threads are ignored"). RELAXED: "The local thread is
// not prohibited from potentially unsafe API calls."
// Which calls are "potentially unsafe" is not listed; the stand-in counts the host-side waits
// and queries (cuEventQuery, cuEventSynchronize): a cudaEventQuery from another thread during a
// global capture fails with cudaErrorStreamCaptureUnsupported on an H100 (alpha0422/study,
// cuda-graph/001.pin-mem.py). Refused calls invalidate the captures that prohibit them.
CUresult CheckUnsafeCall(const char* fn) {
  std::lock_guard<std::mutex> lock(g_mu);
  const std::thread::id me = std::this_thread::get_id();
  std::string why;
  for (const CUstream_st* s : Live<CUstream_st>()) {
    auto* stream = const_cast<CUstream_st*>(s);
    if (!stream->capture) continue;
    const Capture& c = *stream->capture;
    if (t_interaction == CU_STREAM_CAPTURE_MODE_RELAXED) break;
    const bool own = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool other = t_interaction == CU_STREAM_CAPTURE_MODE_GLOBAL && c.thread != me &&
                       c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || other) {
      why = std::string("a potentially unsafe call while ") + (own ? "this" : "another") +
            " thread captures a stream in " + ModeName(c.mode) +
            " mode (the capture is now invalidated)";
      Invalidate(stream);
    }
  }
  if (why.empty()) return CUDA_SUCCESS;
  return Fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn, why);
}

Clock::duration Delay() {
  return config().immediate ? Clock::duration::zero()
                            : std::chrono::microseconds(config().stream_delay_us);
}

// The implicit synchronization of the legacy stream (CUDA Driver API, "Stream synchronization
// behavior", "Legacy default stream"): "The legacy default stream is an implicit stream which
// synchronizes with all other streams in the same CUcontext except for non-blocking streams":
// work on a blocking stream runs after the legacy stream's earlier work, and work on the legacy
// stream after every blocking stream's earlier work; a CU_STREAM_NON_BLOCKING stream waits for
// neither. Under g_mu: the queues `s`'s next operation must wait for, with their counts now.
std::vector<std::pair<std::shared_ptr<Queue>, uint64_t>> ImplicitlyAfter(CUstream h,
                                                                         const CUstream_st* s) {
  std::vector<std::pair<std::shared_ptr<Queue>, uint64_t>> after;
  if (s->legacy) {
    if (h == CU_STREAM_PER_THREAD) return after;  // the stand-in's per-thread stream is the legacy
    for (const CUstream_st* other : Live<CUstream_st>()) {
      if (other->device == s->device && (other->flags & CU_STREAM_NON_BLOCKING) == 0) {
        after.emplace_back(other->queue, other->queue->Enqueued());
      }
    }
  } else if ((s->flags & CU_STREAM_NON_BLOCKING) == 0) {
    const std::shared_ptr<Queue>& legacy = DefaultStream(s->device)->queue;
    after.emplace_back(legacy, legacy->Enqueued());
  }
  return after;
}

// `captured` runs under g_mu instead of recording `op` when the stream captures (for event
// records, which add no node). `delay`: how long after now the work may run at the earliest
// (the knob's stream delay when not given).
CUresult Submit(const char* fn, CUstream h, Op op,
                const std::function<void(CUstream_st*)>& captured = nullptr,
                std::optional<Clock::duration> delay = std::nullopt) {
  std::shared_ptr<Queue> queue;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUstream_st* s = nullptr;
    const CUresult r = Resolve(fn, h, &s);
    if (r != CUDA_SUCCESS) return r;
    if (s->legacy && h != CU_STREAM_PER_THREAD) {
      const std::vector<CUstream_st*> blocking = BlockingCaptures(s->device);
      if (!blocking.empty()) {
        for (CUstream_st* b : blocking) Invalidate(b);
        return Fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, fn,
                    "work on the legacy stream while a blocking stream captures (create capturing "
                    "streams with CU_STREAM_NON_BLOCKING, or use your own stream)");
      }
    }
    if (s->capture) {
      if (s->capture->invalidated) {
        return Fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, fn,
                    "the stream's capture was invalidated by an earlier error; end it with "
                    "cuStreamEndCapture");
      }
      if (captured) {
        captured(s);
      } else {
        s->capture->nodes.push_back(std::move(op));
      }
      return CUDA_SUCCESS;
    }
    queue = s->queue;
    // Immediate mode runs every operation at its enqueue, so earlier work is done already.
    if (!config().immediate) {
      auto after = ImplicitlyAfter(h, s);
      if (!after.empty()) {
        op = [after = std::move(after), op = std::move(op)] {
          for (const auto& [earlier, count] : after) earlier->WaitFor(count);
          op();
        };
      }
    }
  }
  if (config().immediate) {
    queue->RunNow(op);
  } else {
    queue->Push(std::move(op), delay.value_or(Delay()));
  }
  return CUDA_SUCCESS;
}

// Polls `address` until `satisfied`, or dies after the wait timeout.
template <typename T, typename Pred>
void WaitFor(const char* fn, uintptr_t address, uint64_t value, Pred satisfied) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(config().wait_timeout_ms);
  const T* word = HostPointer<const T>(address);
  while (!satisfied(static_cast<uint64_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE)))) {
    if (Clock::now() > deadline) {
      Die(std::string(fn) + ": a stream wait on 0x" +
          [&] {
            char text[32];
            std::snprintf(text, sizeof(text), "%llx", static_cast<unsigned long long>(address));
            return std::string(text);
          }() +
          " for value " + std::to_string(value) + " was never satisfied within " +
          std::to_string(config().wait_timeout_ms) +
          " ms (STASH_STANDIN_WAIT_TIMEOUT_MS); on a GPU the stream would hang");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// A wait operation of cuStreamWaitValue64 / cuStreamBatchMemOp, after validation.
CUresult WaitOp(const char* fn, CUdeviceptr address, uint64_t value, unsigned flags, bool is64,
                Op* out) {
  const size_t width = is64 ? 8 : 4;
  if (address % width != 0 || !DeviceAddressable(address, width)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, fn,
                "the wait address is not aligned, or not device memory or registered host memory "
                "(cuMemHostRegister, then cuMemHostGetDevicePointer)");
  }
  const unsigned condition = flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (condition > CU_STREAM_WAIT_VALUE_NOR) {
    return Fail(CUDA_ERROR_INVALID_VALUE, fn, "unknown wait condition");
  }
  const uint64_t mask = is64 ? ~uint64_t{0} : 0xffffffffULL;
  const uint64_t v = value & mask;
  // CUstreamWaitValue_flags: GEQ is the cyclic (int32_t / int64_t)(*addr - value) >= 0; EQ;
  // AND is (*addr & value) != 0; NOR is ~(*addr | value) != 0.
  auto satisfied = [condition, v, mask, is64](uint64_t now) {
    switch (condition) {
      case CU_STREAM_WAIT_VALUE_GEQ:
        return is64 ? static_cast<int64_t>(now - v) >= 0
                    : static_cast<int32_t>(static_cast<uint32_t>(now - v)) >= 0;
      case CU_STREAM_WAIT_VALUE_EQ:
        return now == v;
      case CU_STREAM_WAIT_VALUE_AND:
        return (now & v) != 0;
      default:
        return (~(now | v) & mask) != 0;
    }
  };
  const std::string name = fn;
  if (is64) {
    *out = [name, address, v, satisfied] {
      WaitFor<uint64_t>(name.c_str(), address, v, satisfied);
    };
  } else {
    *out = [name, address, v, satisfied] {
      WaitFor<uint32_t>(name.c_str(), address, v, satisfied);
    };
  }
  return CUDA_SUCCESS;
}

CUresult WriteOp(const char* fn, CUdeviceptr address, uint64_t value, unsigned flags, bool is64,
                 Op* out) {
  const size_t width = is64 ? 8 : 4;
  if (address % width != 0 || !DeviceAddressable(address, width)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, fn,
                "the write address is not aligned, or not device memory or registered host "
                "memory (cuMemHostRegister, then cuMemHostGetDevicePointer)");
  }
  // CUstreamWriteValue_flags: NO_MEMORY_BARRIER "is not supported in the v2 API".
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT) {
    return Fail(CUDA_ERROR_INVALID_VALUE, fn, "write flags must be CU_STREAM_WRITE_VALUE_DEFAULT");
  }
  if (is64) {
    *out = [address, value] {
      __atomic_store_n(HostPointer<uint64_t>(address), value, __ATOMIC_SEQ_CST);
    };
  } else {
    const auto v32 = static_cast<uint32_t>(value);
    *out = [address, v32] {
      __atomic_store_n(HostPointer<uint32_t>(address), v32, __ATOMIC_SEQ_CST);
    };
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Enqueue(const char* fn, CUstream stream, Op op) {
  return Submit(fn, stream, std::move(op));
}

CUresult EnqueueLate(const char* fn, CUstream stream, Op op) {
  return Submit(fn, stream, std::move(op), nullptr, Delay() * kLateFactor);
}

CUresult CheckSynchronousCall(const char* fn) { return CheckUnsafeCall(fn); }

}  // namespace standin

using standin::Fail;

// ---- Streams ---------------------------------------------------------------------------------

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  int device = 0;
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  if (phStream == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "phStream is NULL");
  if ((Flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "Flags must be DEFAULT or NON_BLOCKING");
  }
  auto* s = new CUstream_st();
  s->device = device;
  s->flags = Flags;
  s->queue = standin::Queue::Start();
  std::lock_guard<std::mutex> lock(standin::g_mu);
  standin::Live<CUstream_st>().insert(s);
  *phStream = s;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  if (standin::IsDefaultHandle(hStream) || standin::Live<CUstream_st>().erase(hStream) == 0) {
    return Fail(CUDA_ERROR_INVALID_HANDLE, __func__,
                "not a live stream (destroyed twice, or the default stream)");
  }
  // The worker finishes the queued work, then ends (see Queue).
  hStream->queue->Close();
  for (const CUevent_st* e : standin::Live<CUevent_st>()) {
    if (e->captured_in == hStream) const_cast<CUevent_st*>(e)->captured_in = nullptr;
  }
  delete hStream;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<standin::Queue> queue;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    CUstream_st* s = nullptr;
    STANDIN_TRY(standin::Resolve(__func__, hStream, &s));
    // Programming Guide, "Prohibited and Unhandled Operations": "It is invalid to synchronize or
    // query the execution status of a stream which is being captured".
    if (s->capture) {
      standin::Invalidate(s);
      return Fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, __func__,
                  "synchronizing a stream that is capturing (the capture is now invalidated)");
    }
    if (s->legacy && hStream != CU_STREAM_PER_THREAD) {
      const std::vector<CUstream_st*> blocking = standin::BlockingCaptures(s->device);
      if (!blocking.empty()) {
        for (CUstream_st* b : blocking) standin::Invalidate(b);
        return Fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, __func__,
                    "synchronizing the legacy stream while a blocking stream captures");
      }
    }
    queue = s->queue;
  }
  queue->WaitIdle();
  return CUDA_SUCCESS;
}

// cuStreamQuery: CUDA_SUCCESS when all the stream's work completed, CUDA_ERROR_NOT_READY before.
// Programming Guide, "Prohibited and Unhandled Operations": "It is invalid to synchronize or
// query the execution status of a stream which is being captured" (the capture is invalidated,
// as for cuStreamSynchronize).
CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<standin::Queue> queue;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    CUstream_st* s = nullptr;
    STANDIN_TRY(standin::Resolve(__func__, hStream, &s));
    if (s->capture) {
      standin::Invalidate(s);
      return Fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, __func__,
                  "querying a stream that is capturing (the capture is now invalidated)");
    }
    queue = s->queue;
  }
  return queue->Idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

// cuLaunchHostFunc: "Enqueues a host function call in a stream. The function will be called after
// currently enqueued work and will block work added after it." It runs on the stream's worker,
// in stream order; under capture it becomes a node like any work. ("The host function must not
// make any CUDA API calls": not checked.)
CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (fn == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "fn is NULL");
  return standin::Submit(__func__, hStream, [fn, userData] { fn(userData); });
}

// cuCtxSynchronize: "Blocks until the device has completed all preceding requested tasks" of
// the current context: here every stream of its device, the default stream included. A
// synchronous call: prohibited while a capture forbids potentially unsafe calls (cudaDevice
// Synchronize during capture is the Programming Guide's example of an unsafe call).
CUresult CUDAAPI cuCtxSynchronize(void) {
  STANDIN_TRY(standin::RequireInit(__func__));
  int device = 0;
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  STANDIN_TRY(standin::CheckUnsafeCall(__func__));
  std::vector<std::shared_ptr<standin::Queue>> queues;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    for (const CUstream_st* stream : standin::Live<CUstream_st>()) {
      if (stream->device == device) queues.push_back(stream->queue);
    }
    queues.push_back(standin::DefaultStream(device)->queue);
  }
  for (const auto& queue : queues) queue->WaitIdle();
  return CUDA_SUCCESS;
}

// cuThreadExchangeStreamCaptureMode: "Sets the calling thread's stream capture interaction mode
// to the value contained in *mode, and overwrites *mode with the previous mode for the thread."
CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (mode == nullptr ||
      (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
       *mode != CU_STREAM_CAPTURE_MODE_RELAXED)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "mode is NULL or not a capture mode");
  }
  const CUstreamCaptureMode previous = standin::t_interaction;
  standin::t_interaction = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (captureStatus == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "NULL status");
  std::lock_guard<std::mutex> lock(standin::g_mu);
  CUstream_st* s = nullptr;
  STANDIN_TRY(standin::Resolve(__func__, hStream, &s));
  // cuStreamIsCapturing: on the legacy stream while a blocking stream in the same context
  // captures, "it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ... The blocking stream capture
  // is not invalidated."
  if (s->legacy && hStream != CU_STREAM_PER_THREAD &&
      !standin::BlockingCaptures(s->device).empty()) {
    return Fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, __func__,
                "querying the legacy stream while a blocking stream captures");
  }
  if (!s->capture) {
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
  } else {
    *captureStatus = s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
  STANDIN_TRY(standin::RequireInit(__func__));
  // cuStreamBeginCapture: "Capture may not be initiated if stream is CU_STREAM_LEGACY"; "it may
  // only be initiated if the stream is not already in capture mode".
  if (standin::IsDefaultHandle(hStream)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "capture on the default stream (the stand-in models capture on created streams)");
  }
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "unknown capture mode");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  CUstream_st* s = nullptr;
  STANDIN_TRY(standin::Resolve(__func__, hStream, &s));
  if (s->capture) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "the stream is already capturing");
  }
  s->capture = std::make_unique<standin::Capture>();
  s->capture->mode = mode;
  s->capture->thread = std::this_thread::get_id();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (phGraph == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "phGraph is NULL");
  std::lock_guard<std::mutex> lock(standin::g_mu);
  CUstream_st* s = nullptr;
  STANDIN_TRY(standin::Resolve(__func__, hStream, &s));
  // cuStreamEndCapture: "Capture must have been initiated on hStream via a call to
  // cuStreamBeginCapture."
  if (!s->capture) {
    return Fail(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, __func__, "the stream is not capturing");
  }
  // "If the mode argument to cuStreamBeginCapture was not CU_STREAM_CAPTURE_MODE_RELAXED, this
  // call must be from the same thread as cuStreamBeginCapture."
  if (s->capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      s->capture->thread != std::this_thread::get_id()) {
    return Fail(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, __func__,
                std::string("the capture began in ") + standin::ModeName(s->capture->mode) +
                    " mode on another thread");
  }
  std::unique_ptr<standin::Capture> capture = std::move(s->capture);
  for (const CUevent_st* e : standin::Live<CUevent_st>()) {
    if (e->captured_in == s) const_cast<CUevent_st*>(e)->captured_in = nullptr;
  }
  // "If capture was invalidated, due to a violation of the rules of stream capture, then a NULL
  // graph will be returned."
  if (capture->invalidated) {
    *phGraph = nullptr;
    return Fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, __func__,
                "the capture was invalidated; no graph");
  }
  auto* g = new CUgraph_st();
  g->nodes = std::move(capture->nodes);
  standin::Live<CUgraph_st>().insert(g);
  *phGraph = g;
  return CUDA_SUCCESS;
}

// ---- Graphs
// ----------------------------------------------------------------------------------------

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                    unsigned long long flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (phGraphExec == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "NULL result");
  if (flags != 0) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__, "instantiation flags are not modelled");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  if (standin::Live<CUgraph_st>().count(hGraph) == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live graph");
  }
  auto* exec = new CUgraphExec_st();
  exec->nodes = std::make_shared<const std::vector<standin::Op>>(hGraph->nodes);
  standin::Live<CUgraphExec_st>().insert(exec);
  *phGraphExec = exec;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<const std::vector<standin::Op>> nodes;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    if (standin::Live<CUgraphExec_st>().count(hGraphExec) == 0) {
      return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live executable graph");
    }
    nodes = hGraphExec->nodes;
  }
  // Every node, in capture order (a captured single stream is a chain), on the launch stream.
  return standin::Submit(__func__, hStream, [nodes] {
    for (const standin::Op& node : *nodes) node();
  });
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  // cuGraphExecDestroy: an executable graph in flight "will not be terminated, but rather freed
  // asynchronously on completion": queued launches hold their own reference to the nodes.
  if (standin::Live<CUgraphExec_st>().erase(hGraphExec) == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live executable graph");
  }
  delete hGraphExec;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  if (standin::Live<CUgraph_st>().erase(hGraph) == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live graph");
  }
  delete hGraph;
  return CUDA_SUCCESS;
}

// ---- Events
// ----------------------------------------------------------------------------------------

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  int device = 0;
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  if (phEvent == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "phEvent is NULL");
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  // cuEventCreate: CU_EVENT_INTERPROCESS needs CU_EVENT_DISABLE_TIMING as well.
  if ((Flags & ~known) != 0 ||
      ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "unknown flags, or INTERPROCESS without DISABLE_TIMING");
  }
  auto* e = new CUevent_st();
  e->flags = Flags;
  e->state = std::make_shared<standin::EventState>();
  std::lock_guard<std::mutex> lock(standin::g_mu);
  standin::Live<CUevent_st>().insert(e);
  *phEvent = e;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<standin::EventState> state;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    if (standin::Live<CUevent_st>().count(hEvent) == 0) {
      return Fail(CUDA_ERROR_INVALID_HANDLE, __func__, "not a live event");
    }
    state = hEvent->state;
  }
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = ++state->recorded;
  }
  bool captured = false;
  const CUresult r = standin::Submit(
      __func__, hStream,
      [state, generation] {
        std::lock_guard<std::mutex> lock(state->mu);
        if (state->completed < generation) state->completed = generation;
        state->cv.notify_all();
      },
      // While capturing, the record adds no node (cuEventRecordWithFlags: only
      // CU_EVENT_RECORD_EXTERNAL makes a captured record an event record node); the event is
      // now "last recorded in a capturing stream".
      [hEvent, &captured](CUstream_st* s) {
        hEvent->captured_in = s;
        captured = true;
      });
  if (r != CUDA_SUCCESS || captured) {
    // Nothing was enqueued for this recording: it must not hold later queries back.
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->completed < generation) state->completed = generation;
    state->cv.notify_all();
    return r;
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  if (standin::Live<CUevent_st>().count(hEvent) != 0) hEvent->captured_in = nullptr;
  return r;
}

namespace {

// The checks cuEventQuery and cuEventSynchronize share; the event's state on success.
CUresult EventCheck(const char* fn, CUevent hEvent, std::shared_ptr<standin::EventState>* state) {
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    if (standin::Live<CUevent_st>().count(hEvent) == 0) {
      return Fail(CUDA_ERROR_INVALID_HANDLE, fn, "not a live event");
    }
    // cuThreadExchangeStreamCaptureMode: every mode is "still prohibited from API calls which
    // necessarily conflict with stream capture, for example, attempting cuEventQuery on an
    // event that was last recorded inside a capture sequence" (CUDA_ERROR_CAPTURED_EVENT).
    if (hEvent->captured_in != nullptr) {
      standin::Invalidate(hEvent->captured_in);
      return Fail(CUDA_ERROR_CAPTURED_EVENT, fn,
                  "the event was last recorded in a capturing stream (that capture is now "
                  "invalidated)");
    }
    *state = hEvent->state;
  }
  return standin::CheckUnsafeCall(fn);
}

}  // namespace

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<standin::EventState> state;
  STANDIN_TRY(EventCheck(__func__, hEvent, &state));
  std::lock_guard<std::mutex> lock(state->mu);
  // cuEventQuery: CUDA_SUCCESS when all captured work completed (also when never recorded),
  // CUDA_ERROR_NOT_READY otherwise. Not a failure: no message.
  return state->completed >= state->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::shared_ptr<standin::EventState> state;
  STANDIN_TRY(EventCheck(__func__, hEvent, &state));
  std::unique_lock<std::mutex> lock(state->mu);
  const uint64_t target = state->recorded;
  // Stream waits die after the wait timeout, so this ends; the margin is for the work after.
  const auto limit = std::chrono::milliseconds(2 * standin::config().wait_timeout_ms + 1000);
  if (!state->cv.wait_for(lock, limit, [&] { return state->completed >= target; })) {
    standin::Die("cuEventSynchronize: the event did not complete within " +
                 std::to_string(limit.count()) + " ms");
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  // cuEventDestroy: an event whose recording has not completed is released when it does
  // (queued work holds the state).
  if (standin::Live<CUevent_st>().erase(hEvent) == 0) {
    return Fail(CUDA_ERROR_INVALID_HANDLE, __func__, "not a live event (destroyed twice?)");
  }
  delete hEvent;
  return CUDA_SUCCESS;
}

// ---- Stream memory operations and memset ------------------------------------------------------

CUresult CUDAAPI cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                     unsigned int flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  standin::Op op;
  STANDIN_TRY(standin::WaitOp(__func__, addr, value, flags, true, &op));
  return standin::Submit(__func__, stream, std::move(op));
}

CUresult CUDAAPI cuStreamBatchMemOp(CUstream stream, unsigned int count,
                                    CUstreamBatchMemOpParams* paramArray, unsigned int flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  // cuStreamBatchMemOp: count "Must be less than 256"; flags "must be 0".
  if (count == 0 || count >= 256 || paramArray == nullptr || flags != 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "count must be in [1, 256), paramArray set and flags 0");
  }
  std::vector<standin::Op> ops;
  for (unsigned i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& p = paramArray[i];
    standin::Op op;
    switch (p.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
        const bool is64 = p.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
        STANDIN_TRY(standin::WaitOp(__func__, p.waitValue.address,
                                    is64 ? p.waitValue.value64 : p.waitValue.value,
                                    p.waitValue.flags, is64, &op));
        break;
      }
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
        const bool is64 = p.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64;
        STANDIN_TRY(standin::WriteOp(__func__, p.writeValue.address,
                                     is64 ? p.writeValue.value64 : p.writeValue.value,
                                     p.writeValue.flags, is64, &op));
        break;
      }
      case CU_STREAM_MEM_OP_BARRIER:
        // CUstreamMemoryBarrier_flags: SYS or GPU scope; the host's full fence covers both.
        if (p.memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_SYS &&
            p.memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_GPU) {
          return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "unknown barrier scope");
        }
        op = [] { __atomic_thread_fence(__ATOMIC_SEQ_CST); };
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        op = [] { __atomic_thread_fence(__ATOMIC_SEQ_CST); };
        break;
      default:
        return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                    "paramArray[" + std::to_string(i) + "] has an unknown operation");
    }
    ops.push_back(std::move(op));
  }
  // "The operations are enqueued in the order they appear in the array."
  return standin::Submit(__func__, stream, [ops = std::move(ops)] {
    for (const standin::Op& op : ops) op();
  });
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                 CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (N == 0) return standin::Submit(__func__, hStream, [] {});
  if (!standin::DeviceAddressable(dstDevice, N)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the range is not mapped device memory or registered host memory");
  }
  // Runs when the stream reaches it: memory unmapped or without cuMemSetAccess by then faults.
  return standin::Submit(__func__, hStream, [dstDevice, uc, N] {
    std::memset(standin::HostPointer(dstDevice), uc, N);
  });
}

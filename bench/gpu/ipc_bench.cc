// stash-bench-gpu ipc: what the daemon's CUDA backend pays to reach a client's memory.
//
// An exporter child (this binary re-exec'd as `ipc-child`, so its CUDA context belongs to
// another process, as a training rank's does) allocates --iters buffers of 64 MiB with cudaMalloc,
// fills each with its own byte, creates one cudaEventInterprocess | cudaEventDisableTiming event
// per buffer and writes the 64-byte memory handle and the 64-byte event handle of each to its
// stdout, then waits until the parent writes "done". The parent times, for each buffer:
//  - cudaIpcOpenMemHandle, first open (each open maps a distinct allocation);
//  - cudaIpcOpenMemHandle of the same handle again (the driver counts references and returns
//    the same pointer) and, as the daemon's real cached path, a lookup of the handle in an
//    unordered_map;
//  - cudaIpcCloseMemHandle (once per open);
//  - cudaIpcOpenEventHandle and cudaEventDestroy of the imported event;
//  - cudaHostRegister(cudaHostRegisterMapped) of one 4 KiB POSIX shm page (how the daemon maps a
//    client's counter events), cudaHostGetDevicePointer and cudaHostUnregister.
// Every opened buffer is checked (its first bytes hold the child's fill byte) and every mapped
// shm page is written by the GPU and read back by the host.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"

namespace stash::bench_gpu {
namespace {

constexpr int kDefaultAllocations = 20;
constexpr uint64_t kAllocationBytes = 64 * kMiB;
constexpr int kLookupsPerSample = 1000;
constexpr int kChildTimeoutMs = 120'000;

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "a memory handle is 64 bytes");
static_assert(sizeof(cudaIpcEventHandle_t) == 64, "an event handle is 64 bytes");

// The fill byte of allocation i.
uint8_t FillByte(int i) { return static_cast<uint8_t>(0x40 + i % 64); }

struct Handles {
  cudaIpcMemHandle_t memory;
  cudaIpcEventHandle_t event;
};

// A CUDA call that may fail without ending the run: the failure is counted and reported.
struct Errors {
  std::vector<std::string> messages;
  bool Ok(cudaError_t error, const char* what) {
    if (error == cudaSuccess) return true;
    messages.push_back(std::string(what) + ": " + cudaGetErrorName(error) + ": " +
                       cudaGetErrorString(error));
    std::fprintf(stderr, "stash-bench-gpu: ipc: %s\n", messages.back().c_str());
    return false;
  }
};

double Us(double t0, double t1) { return (t1 - t0) * 1e6; }

}  // namespace

int RunIpcChild(const Options& options) {
  BecomeChild();
  const int allocations = options.iters > 0 ? options.iters : kDefaultAllocations;
  BENCH_CUDA(cudaSetDevice(options.device));
  std::vector<void*> buffers;
  std::vector<cudaEvent_t> events;
  for (int i = 0; i < allocations; ++i) {
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, kAllocationBytes));
    BENCH_CUDA(cudaMemset(p, FillByte(i), kAllocationBytes));
    cudaEvent_t event = nullptr;
    BENCH_CUDA(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
    BENCH_CUDA(cudaEventRecord(event, nullptr));
    buffers.push_back(p);
    events.push_back(event);
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < allocations; ++i) {
    Handles h{};
    BENCH_CUDA(cudaIpcGetMemHandle(&h.memory, buffers[i]));
    BENCH_CUDA(cudaIpcGetEventHandle(&h.event, events[i]));
    const auto* p = reinterpret_cast<const char*>(&h);
    size_t left = sizeof(h);
    while (left > 0) {
      const ssize_t n = write(STDOUT_FILENO, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Die(1, "ipc-child: the parent closed the pipe");
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  // Wait for "done" (or EOF: the parent is gone); the parent has closed every handle by then.
  char c = 0;
  while (read(STDIN_FILENO, &c, 1) > 0 && c != '\n') {
  }
  for (cudaEvent_t event : events) BENCH_CUDA(cudaEventDestroy(event));
  for (void* p : buffers) BENCH_CUDA(cudaFree(p));
  return 0;
}

int RunIpc(const Options& options) {
  const DeviceInfo device = SelectDevice(options.device);
  const int allocations = options.iters > 0 ? options.iters : kDefaultAllocations;
  std::printf("stash-bench-gpu ipc: %s\n", DeviceLine(device).c_str());
  std::printf("exporter: a child process, %d allocations of %" PRIu64
              " MiB and %d interprocess events;"
              " times are host wall clock, median over the allocations\n\n",
              allocations, kAllocationBytes / kMiB, allocations);

  Child child({"ipc-child", "--device", std::to_string(options.device), "--iters",
               std::to_string(allocations)});
  std::vector<Handles> handles(static_cast<size_t>(allocations));
  for (Handles& h : handles) {
    if (!child.ReadExact(&h, sizeof(h), kChildTimeoutMs)) {
      Die(1,
          "ipc: the exporter child did not send its handles (it failed, see above, or took "
          "longer than 120 s)");
    }
  }

  Errors errors;
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> open_first_us, open_again_us, lookup_ns, close_again_us, close_last_us;
  std::vector<double> event_open_us, event_destroy_us;
  int reopen_same_pointer = 0;
  int contents_ok = 0;
  int events_usable = 0;
  // The daemon's cache: handle bytes -> the pointer opened once.
  std::unordered_map<std::string, void*> cache;
  std::vector<std::string> keys;  // the handles cached so far
  for (int i = 0; i < allocations; ++i) {
    const Handles& h = handles[static_cast<size_t>(i)];
    void* first = nullptr;
    double t0 = NowSeconds();
    if (!errors.Ok(cudaIpcOpenMemHandle(&first, h.memory, cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle (first open)")) {
      continue;
    }
    open_first_us.push_back(Us(t0, NowSeconds()));
    uint8_t head[16] = {};
    if (errors.Ok(cudaMemcpy(head, first, sizeof(head), cudaMemcpyDeviceToHost),
                  "cudaMemcpy from the opened buffer")) {
      bool same = true;
      for (const uint8_t b : head) same = same && b == FillByte(i);
      contents_ok += same ? 1 : 0;
    }
    cache.emplace(std::string(reinterpret_cast<const char*>(&h.memory), sizeof(h.memory)), first);

    void* again = nullptr;
    t0 = NowSeconds();
    const bool reopened =
        errors.Ok(cudaIpcOpenMemHandle(&again, h.memory, cudaIpcMemLazyEnablePeerAccess),
                  "cudaIpcOpenMemHandle (same handle again)");
    if (reopened) {
      open_again_us.push_back(Us(t0, NowSeconds()));
      reopen_same_pointer += again == first ? 1 : 0;
    }

    // The cached path: find a handle's bytes in the map, averaged over many lookups (one is
    // below the clock's resolution), cycling over the handles cached so far so that no lookup
    // can be hoisted out of the loop.
    keys.emplace_back(reinterpret_cast<const char*>(&h.memory), sizeof(h.memory));
    size_t hits = 0;
    t0 = NowSeconds();
    for (int k = 0; k < kLookupsPerSample; ++k) {
      hits += cache.count(keys[static_cast<size_t>(k) % keys.size()]);
    }
    lookup_ns.push_back((NowSeconds() - t0) * 1e9 / kLookupsPerSample);
    if (hits != static_cast<size_t>(kLookupsPerSample) || cache.at(keys.back()) != first) {
      errors.messages.emplace_back("the handle cache lost an entry");
    }

    if (reopened && again != nullptr) {
      t0 = NowSeconds();
      if (errors.Ok(cudaIpcCloseMemHandle(again), "cudaIpcCloseMemHandle (second open)")) {
        close_again_us.push_back(Us(t0, NowSeconds()));
      }
    }
    t0 = NowSeconds();
    if (errors.Ok(cudaIpcCloseMemHandle(first), "cudaIpcCloseMemHandle (last close)")) {
      close_last_us.push_back(Us(t0, NowSeconds()));
    }

    cudaEvent_t event = nullptr;
    t0 = NowSeconds();
    if (!errors.Ok(cudaIpcOpenEventHandle(&event, h.event), "cudaIpcOpenEventHandle")) continue;
    event_open_us.push_back(Us(t0, NowSeconds()));
    // The child recorded the event after its fill and synchronized: waiting on it must work.
    if (errors.Ok(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent (imported event)") &&
        errors.Ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the wait")) {
      ++events_usable;
    }
    t0 = NowSeconds();
    if (errors.Ok(cudaEventDestroy(event), "cudaEventDestroy (imported event)")) {
      event_destroy_us.push_back(Us(t0, NowSeconds()));
    }
  }
  child.WriteLine("done");
  const int child_status = child.Wait(30'000);
  if (child_status != 0) {
    errors.messages.push_back("the exporter child exited with status " +
                              std::to_string(child_status));
  }

  // Counter-event pages: one 4 KiB POSIX shm page each, registered mapped.
  std::vector<double> register_us, device_pointer_us, unregister_us;
  int mapped_ok = 0;
  const long page = sysconf(_SC_PAGESIZE);
  const size_t shm_bytes = 4096 > page ? 4096 : static_cast<size_t>(page);
  for (int i = 0; i < allocations; ++i) {
    const std::string name =
        "/stash-bench-gpu-" + std::to_string(getpid()) + "-" + std::to_string(i);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      errors.messages.push_back("shm_open " + name + ": " + std::strerror(errno));
      continue;
    }
    shm_unlink(name.c_str());  // the mapping keeps it alive
    void* p = nullptr;
    if (ftruncate(fd, static_cast<off_t>(shm_bytes)) == 0) {
      p = mmap(nullptr, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (p == nullptr || p == MAP_FAILED) {
      errors.messages.push_back("ftruncate/mmap of " + name + ": " + std::strerror(errno));
      continue;
    }
    std::memset(p, 0, shm_bytes);
    double t0 = NowSeconds();
    if (errors.Ok(cudaHostRegister(p, shm_bytes, cudaHostRegisterMapped),
                  "cudaHostRegister(4 KiB shm, cudaHostRegisterMapped)")) {
      register_us.push_back(Us(t0, NowSeconds()));
      void* d = nullptr;
      t0 = NowSeconds();
      if (errors.Ok(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer")) {
        device_pointer_us.push_back(Us(t0, NowSeconds()));
        // The GPU writes the counter page through the device pointer (a kernel storing 8
        // non-zero words); the host must see them.
        if (errors.Ok(LaunchFill(static_cast<uint64_t*>(d), 8, 3, stream),
                      "LaunchFill (mapped shm)") &&
            errors.Ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize (mapped shm)")) {
          const auto* words = static_cast<const volatile uint64_t*>(p);
          bool written = true;
          for (int w = 0; w < 8; ++w) written = written && words[w] != 0;
          mapped_ok += written ? 1 : 0;
        }
      }
      t0 = NowSeconds();
      if (errors.Ok(cudaHostUnregister(p), "cudaHostUnregister")) {
        unregister_us.push_back(Us(t0, NowSeconds()));
      }
    }
    munmap(p, shm_bytes);
  }
  BENCH_CUDA(cudaStreamDestroy(stream));

  std::printf("%-52s | %10s | %10s | %7s\n", "operation", "median us", "p90 us", "samples");
  std::printf(
      "-----------------------------------------------------+------------+------------+--------\n");
  auto row = [](const char* what, const std::vector<double>& us) {
    std::printf("%-52s | %10.2f | %10.2f | %7zu\n", what, Median(us), Percentile(us, 0.9),
                us.size());
  };
  row("cudaIpcOpenMemHandle, first open (64 MiB)", open_first_us);
  row("cudaIpcOpenMemHandle, same handle again (refcount)", open_again_us);
  row("cudaIpcCloseMemHandle, dropping the second open", close_again_us);
  row("cudaIpcCloseMemHandle, last close (unmaps)", close_last_us);
  row("cudaIpcOpenEventHandle", event_open_us);
  row("cudaEventDestroy (imported event)", event_destroy_us);
  row("cudaHostRegister 4 KiB shm page, mapped", register_us);
  row("cudaHostGetDevicePointer", device_pointer_us);
  row("cudaHostUnregister 4 KiB", unregister_us);
  std::printf("%-52s | %10.3f | %10.3f | %7zu\n", "cached: unordered_map lookup of a handle",
              Median(lookup_ns) / 1e3, Percentile(lookup_ns, 0.9) / 1e3, lookup_ns.size());
  std::printf(
      "\nreopen returned the same pointer: %d of %zu; opened buffers held the child's bytes: %d "
      "of %zu;\nimported events usable: %d of %zu; mapped shm pages written by the GPU: %d of "
      "%zu\n",
      reopen_same_pointer, open_again_us.size(), contents_ok, open_first_us.size(), events_usable,
      event_open_us.size(), mapped_ok, register_us.size());
  const bool ok = errors.messages.empty() && contents_ok == allocations &&
                  events_usable == allocations && mapped_ok == allocations;
  if (!errors.messages.empty()) {
    std::printf("\n%zu errors (first: %s)\n", errors.messages.size(),
                errors.messages.front().c_str());
  }

  std::vector<std::string> error_json;
  for (const std::string& m : errors.messages) error_json.push_back(json::Str(m));
  const std::string report = json::PrettyObject({
      {"bench", json::Str("ipc")},
      {"device", DeviceJson(device)},
      {"config", json::Object({{"allocations", json::Int(allocations)},
                               {"allocation_bytes", json::Int(kAllocationBytes)},
                               {"shm_page_bytes", json::Int(static_cast<int64_t>(shm_bytes))}})},
      {"mem_open_first_us", json::Summary(open_first_us)},
      {"mem_open_again_us", json::Summary(open_again_us)},
      {"mem_open_again_same_pointer", json::Int(reopen_same_pointer)},
      {"cache_lookup_ns", json::Summary(lookup_ns)},
      {"mem_close_again_us", json::Summary(close_again_us)},
      {"mem_close_last_us", json::Summary(close_last_us)},
      {"event_open_us", json::Summary(event_open_us)},
      {"event_destroy_us", json::Summary(event_destroy_us)},
      {"event_usable", json::Int(events_usable)},
      {"host_register_4k_us", json::Summary(register_us)},
      {"host_get_device_pointer_us", json::Summary(device_pointer_us)},
      {"host_unregister_4k_us", json::Summary(unregister_us)},
      {"host_register_mapped_ok", json::Int(mapped_ok)},
      {"errors", json::Array(error_json)},
      {"summary", json::Object({{"mem_open_first_us_median", json::Num(Median(open_first_us))},
                                {"mem_open_again_us_median", json::Num(Median(open_again_us))},
                                {"cache_lookup_ns_median", json::Num(Median(lookup_ns))},
                                {"event_open_us_median", json::Num(Median(event_open_us))},
                                {"host_register_4k_us_median", json::Num(Median(register_us))}})},
      {"ok", json::Bool(ok)},
  });
  WriteJsonFile(options.json_path, report);
  return ok ? 0 : 1;
}

}  // namespace stash::bench_gpu

// Shared pieces of stash-bench-gpu: options, the CUDA check, device facts, statistics, a small
// JSON writer, exec'd child processes and the "gate" that makes event timings GPU-only.
//
// A benchmark, not a library: a failed CUDA call prints the call, its error and where, and exits
// with status 1 (a half-measured figure is worse than none).
#ifndef STASH_BENCH_GPU_COMMON_H_
#define STASH_BENCH_GPU_COMMON_H_

#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stash::bench_gpu {

inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kKiB = int64_t{1} << 10;

// The command line, parsed (see Usage()).
struct Options {
  std::string command;                                   // copy, ipc, overlap (or a child role)
  int device = 0;                                        // --device: CUDA device index
  int peer_device = -1;                                  // --peer-device (peer): -1 = device + 1
  int iters = 0;                                         // --iters: 0 = the subcommand's default
  std::vector<int64_t> sizes_mib{1, 16, 64, 256, 1024};  // --sizes (copy, peer), MiB each
  bool sizes_given = false;                              // --sizes was on the command line
  int64_t copy_mib = 256;                                // --copy-mib (overlap): one stash, MiB
  double launch_ms = 1.5;                                // --launch-ms (overlap): trainer kernel
  std::string json_path;                                 // --json: also write JSON there; "" = no
};

// The subcommands, run by main after the device check. Each returns the exit status.
int RunCopy(const Options& options);
int RunIpc(const Options& options);
int RunIpcChild(const Options& options);
int RunOverlap(const Options& options);
int RunOverlapTrainer(const Options& options);
int RunMappedOverlap(const Options& options);
int RunMappedTrainer(const Options& options);
int RunPeer(const Options& options);
int RunWait(const Options& options);
int RunWaitChild(const Options& options);

// Exits with status 1 after printing "stash-bench-gpu: <expr> failed: <name>: <string> (file:line)"
// when `error` is not cudaSuccess.
void CheckCuda(cudaError_t error, const char* expression, const char* file, int line);
#define BENCH_CUDA(expr) ::stash::bench_gpu::CheckCuda((expr), #expr, __FILE__, __LINE__)

// Prints "stash-bench-gpu: <message>" to stderr and exits with `status`.
[[noreturn]] void Die(int status, const std::string& message);

// Facts about the device in use (after SelectDevice).
struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int64_t memory_bytes = 0;
  int compute_mode = 0;  // cudaComputeMode: 0 default (shared), 2 prohibited, 3 exclusive process
  double memory_peak_gbps = 0;  // HBM/DRAM peak: 2 x memory clock x bus width; 0 = unknown
  int driver_version = 0;
  int runtime_version = 0;
  int host_register_supported = 0;
};

// Makes `device` current and creates its context. Returns the device facts.
DeviceInfo SelectDevice(int device);
// {"index": 0, "name": "...", ...}
std::string DeviceJson(const DeviceInfo& info);
// One line: "NVIDIA H200 (device 0, 132 SMs, 139.8 GiB), driver 13000, runtime 13000".
std::string DeviceLine(const DeviceInfo& info);

// Wall-clock seconds since an arbitrary start (steady clock).
double NowSeconds();

// Statistics over samples (copied, sorted inside). Empty input gives NaN.
double Median(std::vector<double> samples);
double Percentile(std::vector<double> samples, double fraction);  // fraction in [0, 1]
double Min(const std::vector<double>& samples);
double Max(const std::vector<double>& samples);

// A JSON value as text. Numbers that are not finite become null.
namespace json {
std::string Str(const std::string& value);
std::string Num(double value);
std::string Int(int64_t value);
std::string Bool(bool value);
inline std::string Null() { return "null"; }
using Fields = std::vector<std::pair<std::string, std::string>>;
// {"a": 1, "b": 2} on one line.
std::string Object(const Fields& fields);
// Keys one per line ("  \"key\": value"), for the top level of a report.
std::string PrettyObject(const Fields& fields);
std::string Array(const std::vector<std::string>& items);
// {"median": .., "p90": .., "min": .., "max": .., "samples": n}
std::string Summary(const std::vector<double>& samples);
}  // namespace json

// Writes `text` to `path` (when not empty). Dies on failure.
void WriteJsonFile(const std::string& path, const std::string& text);

// A child process running this same binary (/proc/self/exe) with `args`; its stdin and stdout
// are pipes to this process, its stderr is ours. The child is killed and reaped on destruction
// if it still runs. Not thread-safe.
class Child {
 public:
  // Starts the child; dies when it cannot.
  explicit Child(const std::vector<std::string>& args);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Writes all `bytes` to the child's stdin; false when the child is gone.
  bool Write(const void* data, size_t bytes);
  bool WriteLine(const std::string& line) { return Write((line + "\n").data(), line.size() + 1); }
  // Reads exactly `bytes` from the child's stdout; false on EOF or after `timeout_ms`.
  bool ReadExact(void* data, size_t bytes, int timeout_ms);
  // Reads one line (without '\n'); false on EOF or after `timeout_ms`. 0 = do not wait.
  bool ReadLine(std::string* line, int timeout_ms);
  // Waits up to `timeout_ms` for the child to exit, then kills it. Returns its exit status, or
  // -1 when it had to be killed or did not exit normally.
  int Wait(int timeout_ms);
  pid_t pid() const { return pid_; }

 private:
  // Reads what is available into buffered_ within `timeout_ms`; false on EOF, error or timeout.
  bool Fill(int timeout_ms);

  pid_t pid_ = -1;
  int to_child_ = -1;    // the child's stdin
  int from_child_ = -1;  // the child's stdout
  std::string buffered_;
  bool reaped_ = false;
};

// For a child role: dies with the parent (PR_SET_PDEATHSIG) and writes nothing but protocol
// to stdout.
void BecomeChild();

// Holds a stream behind a spinning kernel until Release(), so that the work enqueued after it
// runs back to back and event timings measure the GPU only, not the host's launch gaps (the
// nvbench "blocking kernel"). The kernel gives up after a timeout, so a full launch queue can
// never deadlock the host; such a batch is counted in timeouts().
class Gate {
 public:
  Gate();
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Enqueues the spinning kernel on `stream`. The previous batch must have been Checked.
  void Block(cudaStream_t stream);
  // Lets the kernel finish: the work behind it starts.
  void Release();
  // After the stream has synchronized: counts the batch in timeouts() when its gate gave up.
  void Check();
  // Batches whose gate timed out (their timings may include launch gaps).
  int timeouts() const { return timeouts_; }

 private:
  int32_t* host_ = nullptr;  // [0] = release flag, [1] = timed-out flag (mapped pinned memory)
  int32_t* device_ = nullptr;
  int timeouts_ = 0;
};

// Elapsed milliseconds between two recorded, completed events.
double ElapsedMs(cudaEvent_t start, cudaEvent_t end);

// Times `iters` iterations of `phases` operations that `enqueue(phase)` enqueues on `stream`,
// 16 iterations behind each gate, with an event before the first phase and after each. Returns
// each phase's per-iteration milliseconds (GPU time).
template <typename Enqueue>
std::vector<std::vector<double>> TimeGated(Gate& gate, cudaStream_t stream, int iters, int phases,
                                           Enqueue enqueue) {
  constexpr int kPerGate = 16;
  const auto stride = static_cast<size_t>(phases) + 1;
  std::vector<std::vector<double>> ms(static_cast<size_t>(phases));
  std::vector<cudaEvent_t> events(kPerGate * stride);
  for (cudaEvent_t& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int done = 0; done < iters;) {
    const int n = iters - done < kPerGate ? iters - done : kPerGate;
    gate.Block(stream);
    for (int i = 0; i < n; ++i) {
      cudaEvent_t* ev = &events[static_cast<size_t>(i) * stride];
      BENCH_CUDA(cudaEventRecord(ev[0], stream));
      for (int p = 0; p < phases; ++p) {
        enqueue(p);
        BENCH_CUDA(cudaEventRecord(ev[p + 1], stream));
      }
    }
    gate.Release();
    BENCH_CUDA(cudaStreamSynchronize(stream));
    gate.Check();
    for (int i = 0; i < n; ++i) {
      const cudaEvent_t* ev = &events[static_cast<size_t>(i) * stride];
      for (int p = 0; p < phases; ++p) ms[p].push_back(ElapsedMs(ev[p], ev[p + 1]));
    }
    done += n;
  }
  for (cudaEvent_t e : events) BENCH_CUDA(cudaEventDestroy(e));
  return ms;
}

}  // namespace stash::bench_gpu

#endif  // STASH_BENCH_GPU_COMMON_H_

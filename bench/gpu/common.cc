// Shared pieces of stash-bench-gpu (see common.h).
#include "bench/gpu/common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/gpu/bench_kernels.h"

extern char** environ;

namespace stash::bench_gpu {

void CheckCuda(cudaError_t error, const char* expression, const char* file, int line) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "stash-bench-gpu: %s failed: %s: %s (%s:%d)\n", expression,
               cudaGetErrorName(error), cudaGetErrorString(error), file, line);
  std::fflush(stderr);
  std::exit(1);
}

void Die(int status, const std::string& message) {
  std::fprintf(stderr, "stash-bench-gpu: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(status);
}

DeviceInfo SelectDevice(int device) {
  DeviceInfo info;
  info.index = device;
  BENCH_CUDA(cudaSetDevice(device));
  BENCH_CUDA(cudaFree(nullptr));  // creates the context now, outside every timed region
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  info.name = prop.name;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  BENCH_CUDA(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
  BENCH_CUDA(cudaDeviceGetAttribute(&info.compute_mode, cudaDevAttrComputeMode, device));
  BENCH_CUDA(cudaDeviceGetAttribute(&info.host_register_supported, cudaDevAttrHostRegisterSupported,
                                    device));
  // Peak DRAM bandwidth from the memory clock and the bus width, two transfers per clock (what
  // NVIDIA's own peak figures assume): 0 when the driver reports neither.
  int clock_khz = 0, bus_bits = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  BENCH_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  info.memory_peak_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  BENCH_CUDA(cudaDriverGetVersion(&info.driver_version));
  BENCH_CUDA(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

std::string DeviceJson(const DeviceInfo& info) {
  return json::Object(
      {{"index", json::Int(info.index)},
       {"name", json::Str(info.name)},
       {"sm_count", json::Int(info.sm_count)},
       {"memory_bytes", json::Int(info.memory_bytes)},
       {"compute_mode", json::Int(info.compute_mode)},
       {"memory_peak_gbps",
        info.memory_peak_gbps > 0 ? json::Num(info.memory_peak_gbps) : json::Null()},
       {"driver_version", json::Int(info.driver_version)},
       {"runtime_version", json::Int(info.runtime_version)}});
}

std::string DeviceLine(const DeviceInfo& info) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "%s (device %d, %d SMs, %.1f GiB, memory peak %.0f GB/s), driver %d, runtime %d",
                info.name.c_str(), info.index, info.sm_count,
                static_cast<double>(info.memory_bytes) / static_cast<double>(kMiB * 1024),
                info.memory_peak_gbps, info.driver_version, info.runtime_version);
  return line;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Percentile(std::vector<double> samples, double fraction) {
  if (samples.empty()) return std::nan("");
  std::sort(samples.begin(), samples.end());
  const double position = fraction * static_cast<double>(samples.size() - 1);
  const auto below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, samples.size() - 1);
  const double weight = position - static_cast<double>(below);
  return samples[below] * (1.0 - weight) + samples[above] * weight;
}

double Median(std::vector<double> samples) { return Percentile(std::move(samples), 0.5); }

double Min(const std::vector<double>& samples) {
  if (samples.empty()) return std::nan("");
  return *std::min_element(samples.begin(), samples.end());
}

double Max(const std::vector<double>& samples) {
  if (samples.empty()) return std::nan("");
  return *std::max_element(samples.begin(), samples.end());
}

namespace json {

std::string Str(const std::string& value) {
  std::string out = "\"";
  for (const char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Num(double value) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

std::string Int(int64_t value) { return std::to_string(value); }

std::string Bool(bool value) { return value ? "true" : "false"; }

std::string Object(const Fields& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ", ";
    out += Str(fields[i].first) + ": " + fields[i].second;
  }
  return out + "}";
}

std::string PrettyObject(const Fields& fields) {
  std::string out = "{\n";
  for (size_t i = 0; i < fields.size(); ++i) {
    out += "  " + Str(fields[i].first) + ": " + fields[i].second;
    out += i + 1 < fields.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

std::string Array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ",\n    ";
    out += items[i];
  }
  return out + "]";
}

std::string Summary(const std::vector<double>& samples) {
  return Object({{"median", Num(Median(samples))},
                 {"p90", Num(Percentile(samples, 0.9))},
                 {"min", Num(Min(samples))},
                 {"max", Num(Max(samples))},
                 {"samples", Int(static_cast<int64_t>(samples.size()))}});
}

}  // namespace json

void WriteJsonFile(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) Die(1, "cannot write --json file '" + path + "': " + std::strerror(errno));
  std::printf("JSON written to %s\n", path.c_str());
}

// ---- Child -------------------------------------------------------------------------------------

namespace {

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

Child::Child(const std::vector<std::string>& args) {
  int in_pipe[2];   // parent writes [1], child reads [0] as stdin
  int out_pipe[2];  // child writes [1] as stdout, parent reads [0]
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
    Die(1, std::string("pipe2: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears close-on-exec on the new descriptor; every other pipe end closes at exec.
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  std::vector<std::string> argv_strings{"stash-bench-gpu"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int spawn_error =
      posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  to_child_ = in_pipe[1];
  from_child_ = out_pipe[0];
  if (spawn_error != 0) {
    CloseFd(&to_child_);
    CloseFd(&from_child_);
    Die(1, std::string("posix_spawn /proc/self/exe: ") + std::strerror(spawn_error));
  }
}

Child::~Child() {
  CloseFd(&to_child_);
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  CloseFd(&from_child_);
}

bool Child::Write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(to_child_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool Child::Fill(int timeout_ms) {
  pollfd pfd{from_child_, POLLIN, 0};
  int ready = 0;
  do {
    ready = poll(&pfd, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) return false;
  char chunk[4096];
  ssize_t n = 0;
  do {
    n = read(from_child_, chunk, sizeof(chunk));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buffered_.append(chunk, static_cast<size_t>(n));
  return true;
}

bool Child::ReadExact(void* data, size_t bytes, int timeout_ms) {
  const double deadline = NowSeconds() + timeout_ms / 1000.0;
  while (buffered_.size() < bytes) {
    const int left_ms = static_cast<int>((deadline - NowSeconds()) * 1000.0);
    if (left_ms < 0 || !Fill(left_ms)) return false;
  }
  std::memcpy(data, buffered_.data(), bytes);
  buffered_.erase(0, bytes);
  return true;
}

bool Child::ReadLine(std::string* line, int timeout_ms) {
  const double deadline = NowSeconds() + timeout_ms / 1000.0;
  size_t newline = buffered_.find('\n');
  while (newline == std::string::npos) {
    const int left_ms = std::max(0, static_cast<int>((deadline - NowSeconds()) * 1000.0));
    if (!Fill(left_ms)) return false;
    newline = buffered_.find('\n');
  }
  *line = buffered_.substr(0, newline);
  buffered_.erase(0, newline + 1);
  return true;
}

int Child::Wait(int timeout_ms) {
  if (reaped_) return -1;
  CloseFd(&to_child_);  // a child waiting for input sees EOF
  const double deadline = NowSeconds() + timeout_ms / 1000.0;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (done < 0 && errno != EINTR) return -1;
    if (NowSeconds() > deadline) {
      kill(pid_, SIGKILL);
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      reaped_ = true;
      return -1;
    }
    usleep(10000);
  }
  reaped_ = true;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void BecomeChild() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) std::exit(1);  // the parent is already gone
}

// ---- Gate
// ----------------------------------------------------------------------------------------

namespace {
// Long enough for a batch of a few hundred enqueued operations, short enough that a gate that
// gives up costs little.
constexpr uint64_t kGateTimeoutNs = 2'000'000'000;
}  // namespace

Gate::Gate() {
  void* host = nullptr;
  BENCH_CUDA(cudaHostAlloc(&host, 2 * sizeof(int32_t), cudaHostAllocMapped));
  host_ = static_cast<int32_t*>(host);
  host_[0] = 0;
  host_[1] = 0;
  void* device = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(&device, host, 0));
  device_ = static_cast<int32_t*>(device);
}

Gate::~Gate() {
  if (host_ != nullptr) cudaFreeHost(host_);  // at exit; nothing useful to do on failure
}

void Gate::Block(cudaStream_t stream) {
  static_cast<volatile int32_t*>(host_)[0] = 0;
  static_cast<volatile int32_t*>(host_)[1] = 0;
  BENCH_CUDA(LaunchGate(device_, kGateTimeoutNs, stream));
}

void Gate::Release() { static_cast<volatile int32_t*>(host_)[0] = 1; }

void Gate::Check() {
  if (static_cast<volatile int32_t*>(host_)[1] != 0) ++timeouts_;
}

double ElapsedMs(cudaEvent_t start, cudaEvent_t end) {
  float ms = 0.0f;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, end));
  return static_cast<double>(ms);
}

}  // namespace stash::bench_gpu

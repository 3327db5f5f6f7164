// TEST AID, NEVER A BACKEND (see standin.h): initialization, errors, devices, primary contexts,
// modules and kernel twins of the CUDA driver stand-in, plus the entry points it does not model.
//
// Contracts cite the CUDA Driver API reference (the doc comments of cuda.h, CUDA 13.0, which are
// that reference's text) by section and function.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "internal.h"
#include "standin.h"

// A primary context: CUcontext is a pointer to one of these (cuda.h only declares the struct).
struct CUctx_st {
  int device = 0;
  std::atomic<int> retains{0};
};

// A loaded module: any image is accepted; functions resolve against the twin registry.
struct CUmod_st {
  int device = 0;
  bool loaded = true;
  std::map<std::string, CUfunc_st*> functions;
};

struct CUfunc_st {
  std::string name;
  StashStandinKernel fn = nullptr;
  std::vector<size_t> param_sizes;
  CUmod_st* module = nullptr;  // not owned; modules are never freed (unloaded ones stay marked)
};

namespace standin {
namespace {

std::atomic<bool> g_initialized{false};
std::mutex g_mu;  // the config while it is (re)read, modules, the twin registry

Config& MutableConfig() {
  static auto* config = new Config();  // never freed: stream workers may run during exit
  return *config;
}

CUctx_st* PrimaryContexts() {
  static auto* contexts = new CUctx_st[kMaxDevices];
  return contexts;
}

// The calling thread's context stack (CUDA Driver API, Context Management: each host thread has
// its own stack of current contexts).
std::vector<CUctx_st*>& ContextStack() {
  thread_local std::vector<CUctx_st*> stack;
  return stack;
}

struct Twin {
  StashStandinKernel fn = nullptr;
  std::vector<size_t> param_sizes;
};

std::map<std::string, Twin>& Twins() {
  static auto* twins = new std::map<std::string, Twin>();
  return *twins;
}

std::map<const CUmod_st*, CUmod_st*>& Modules() {
  static auto* modules = new std::map<const CUmod_st*, CUmod_st*>();
  return *modules;
}

std::map<const CUfunc_st*, CUfunc_st*>& Functions() {
  static auto* functions = new std::map<const CUfunc_st*, CUfunc_st*>();
  return *functions;
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    Die(std::string(name) + "=" + text + " is not a non-negative integer");
  }
  return value;
}

bool EnvFlag(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr && std::strcmp(text, "1") == 0;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

// Every code the stand-in returns, with the driver's name and (shortened) description.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* FindError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

CUctx_st* AsPrimary(CUcontext ctx) {
  CUctx_st* contexts = PrimaryContexts();
  for (int i = 0; i < kMaxDevices; ++i) {
    if (ctx == &contexts[i]) return ctx;
  }
  return nullptr;
}

}  // namespace

bool Initialized() { return g_initialized.load(std::memory_order_acquire); }
const Config& config() { return MutableConfig(); }
bool ValidDevice(int ordinal) { return ordinal >= 0 && ordinal < config().devices; }

CUresult Fail(CUresult code, const char* fn, const std::string& why) {
  const ErrorText* e = FindError(code);
  std::fprintf(stderr, "cuda-standin: %s: %s: %s\n", fn, e != nullptr ? e->name : "CUDA error",
               why.c_str());
  return code;
}

void Die(const std::string& why) {
  std::fprintf(stderr, "cuda-standin: FATAL: %s\n", why.c_str());
  std::fflush(stderr);
  std::abort();
}

CUresult RequireInit(const char* fn) {
  if (Initialized()) return CUDA_SUCCESS;
  // CUDA Driver API, Initialization (cuInit): "must be called before any other function from
  // the driver API"; until then every call returns CUDA_ERROR_NOT_INITIALIZED.
  return Fail(CUDA_ERROR_NOT_INITIALIZED, fn, "cuInit(0) has not been called in this process");
}

void LoadConfig() {
  Config& c = MutableConfig();
  c.devices = static_cast<int>(EnvInt("STASH_STANDIN_DEVICES", 2));
  if (c.devices > kMaxDevices) Die("STASH_STANDIN_DEVICES is over 64");
  c.vmm = !EnvFlag("STASH_STANDIN_NO_VMM");
  c.posix_fd = !EnvFlag("STASH_STANDIN_NO_POSIX_FD");
  c.peer = !EnvFlag("STASH_STANDIN_NO_PEER");
  c.vram_bytes = static_cast<uint64_t>(EnvInt("STASH_STANDIN_VRAM_BYTES", int64_t{1} << 30));
  const char* streams = std::getenv("STASH_STANDIN_STREAMS");
  c.immediate = streams != nullptr && std::strcmp(streams, "immediate") == 0;
  if (streams != nullptr && *streams != '\0' && !c.immediate &&
      std::strcmp(streams, "deferred") != 0) {
    Die(std::string("STASH_STANDIN_STREAMS=") + streams + ": use deferred or immediate");
  }
  c.stream_delay_us = EnvInt("STASH_STANDIN_STREAM_DELAY_US", 2000);
  c.wait_timeout_ms = EnvInt("STASH_STANDIN_WAIT_TIMEOUT_MS", 10000);
  c.launch_delay_us = EnvInt("STASH_STANDIN_LAUNCH_DELAY_US", 0);
  if (c.registry_dir.empty()) {
    const char* dir = std::getenv("STASH_STANDIN_REGISTRY");
    c.registry_dir = (dir != nullptr && *dir != '\0')
                         ? std::string(dir)
                         : "/tmp/stash-cuda-standin-" + std::to_string(getuid());
    if (mkdir(c.registry_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      Die("cannot create the registry folder " + c.registry_dir + ": " + std::strerror(errno));
    }
  }
  CUctx_st* contexts = PrimaryContexts();
  for (int i = 0; i < kMaxDevices; ++i) contexts[i].device = i;
}

CUresult CurrentDevice(const char* fn, int* device) {
  const std::vector<CUctx_st*>& stack = ContextStack();
  // CUDA Driver API, Context Management: calls that work in the current context return
  // CUDA_ERROR_INVALID_CONTEXT when the calling thread has none.
  if (stack.empty()) {
    return Fail(CUDA_ERROR_INVALID_CONTEXT, fn,
                "no current context on this thread (cuDevicePrimaryCtxRetain, then "
                "cuCtxPushCurrent or cuCtxSetCurrent)");
  }
  if (stack.back()->retains.load() <= 0) {
    return Fail(CUDA_ERROR_INVALID_CONTEXT, fn,
                "the current primary context of device " + std::to_string(stack.back()->device) +
                    " is not retained (cuDevicePrimaryCtxRelease dropped its last reference)");
  }
  *device = stack.back()->device;
  return CUDA_SUCCESS;
}

}  // namespace standin

using standin::Fail;

#define STANDIN_REQUIRE_INIT()                             \
  do {                                                     \
    const CUresult init_ = standin::RequireInit(__func__); \
    if (init_ != CUDA_SUCCESS) return init_;               \
  } while (0)

#define STANDIN_NOT_MODELLED()                                                    \
  do {                                                                            \
    STANDIN_REQUIRE_INIT();                                                       \
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,                               \
                "not modelled by the CUDA driver stand-in (tests/cuda_standin)"); \
  } while (0)

// ---- Initialization and errors --------------------------------------------------------------

CUresult CUDAAPI cuInit(unsigned int Flags) {
  // CUDA Driver API, Initialization, cuInit: "Currently, the Flags parameter must be 0."
  if (Flags != 0) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "Flags must be 0");
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    standin::LoadConfig();
  }
  standin::g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  // CUDA Driver API, Error Handling, cuGetErrorName: an unrecognized code is
  // CUDA_ERROR_INVALID_VALUE and *pStr is set to NULL.
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const standin::ErrorText* e = standin::FindError(error);
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const standin::ErrorText* e = standin::FindError(error);
  *pStr = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---- Devices -----------------------------------------------------------------------------------

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  STANDIN_REQUIRE_INIT();
  if (count == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "count is NULL");
  *count = standin::config().devices;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  STANDIN_REQUIRE_INIT();
  if (device == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "device is NULL");
  // CUDA Driver API, Device Management, cuDeviceGet: ordinal in [0, cuDeviceGetCount()).
  if (!standin::ValidDevice(ordinal)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__,
                "ordinal " + std::to_string(ordinal) + " is not below the device count " +
                    std::to_string(standin::config().devices));
  }
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  STANDIN_REQUIRE_INIT();
  if (pi == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "pi is NULL");
  if (!standin::ValidDevice(dev)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__, "device " + std::to_string(dev));
  }
  const standin::Config& c = standin::config();
  // Hopper-like answers (an H100/H200): the attributes code commonly asks for.
  const struct {
    CUdevice_attribute attribute;
    int value;
  } kValues[] = {
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, c.vmm ? 1 : 0},
      {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
       c.vmm && c.posix_fd ? 1 : 0},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1},
      {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev + 1},
      {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
      {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
      {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0},
      {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0},
  };
  for (const auto& known : kValues) {
    if (known.attribute == attrib) {
      *pi = known.value;
      return CUDA_SUCCESS;
    }
  }
  return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
              "attribute " + std::to_string(static_cast<int>(attrib)) +
                  " is not modelled (add it in tests/cuda_standin/device.cc)");
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  STANDIN_REQUIRE_INIT();
  if (uuid == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "uuid is NULL");
  if (!standin::ValidDevice(dev)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__, "device " + std::to_string(dev));
  }
  // Stable across processes and runs, distinct per device.
  static constexpr char kPrefix[] = "stash-standin";  // 13 characters
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, kPrefix, sizeof(kPrefix) - 1);
  uuid->bytes[14] = static_cast<char>((dev >> 8) & 0xff);
  uuid->bytes[15] = static_cast<char>(dev & 0xff);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  STANDIN_REQUIRE_INIT();
  if (canAccessPeer == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "NULL result");
  if (!standin::ValidDevice(dev) || !standin::ValidDevice(peerDev)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__,
                "device " + std::to_string(dev) + " or " + std::to_string(peerDev));
  }
  *canAccessPeer = (dev != peerDev && standin::config().peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

// ---- Primary contexts
// ----------------------------------------------------------------------------

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  STANDIN_REQUIRE_INIT();
  if (pctx == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "pctx is NULL");
  if (!standin::ValidDevice(dev)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__, "device " + std::to_string(dev));
  }
  CUctx_st* ctx = &standin::PrimaryContexts()[dev];
  ctx->retains.fetch_add(1);
  *pctx = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  STANDIN_REQUIRE_INIT();
  if (!standin::ValidDevice(dev)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__, "device " + std::to_string(dev));
  }
  // CUDA Driver API, Primary Context Management, cuDevicePrimaryCtxRelease: releases one
  // reference taken by cuDevicePrimaryCtxRetain; more releases than retains is an error.
  CUctx_st* ctx = &standin::PrimaryContexts()[dev];
  int retains = ctx->retains.load();
  do {
    if (retains <= 0) {
      return Fail(CUDA_ERROR_INVALID_CONTEXT, __func__,
                  "device " + std::to_string(dev) + "'s primary context is not retained");
    }
  } while (!ctx->retains.compare_exchange_weak(retains, retains - 1));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  STANDIN_REQUIRE_INIT();
  if (standin::AsPrimary(ctx) == nullptr) {
    return Fail(CUDA_ERROR_INVALID_CONTEXT, __func__,
                "not a primary context of the stand-in (only primary contexts are modelled)");
  }
  standin::ContextStack().push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx) {
  STANDIN_REQUIRE_INIT();
  std::vector<CUctx_st*>& stack = standin::ContextStack();
  // CUDA Driver API, Context Management, cuCtxPopCurrent: CUDA_ERROR_INVALID_CONTEXT without a
  // current context.
  if (stack.empty()) return Fail(CUDA_ERROR_INVALID_CONTEXT, __func__, "no current context");
  if (pctx != nullptr) *pctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  STANDIN_REQUIRE_INIT();
  std::vector<CUctx_st*>& stack = standin::ContextStack();
  // CUDA Driver API, Context Management, cuCtxSetCurrent: replaces the top of the stack (pushes
  // on an empty one); NULL pops (a no-op on an empty stack).
  if (ctx == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (standin::AsPrimary(ctx) == nullptr) {
    return Fail(CUDA_ERROR_INVALID_CONTEXT, __func__, "not a primary context of the stand-in");
  }
  if (stack.empty()) {
    stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

// ---- Modules and kernel twins -----------------------------------------------------------------

extern "C" __attribute__((visibility("default"))) int stash_standin_register_kernel(
    const char* name, StashStandinKernel fn, unsigned param_count, const size_t* param_sizes) {
  if (name == nullptr || fn == nullptr || (param_count > 0 && param_sizes == nullptr)) {
    std::fprintf(stderr, "cuda-standin: stash_standin_register_kernel: bad arguments\n");
    return -1;
  }
  standin::Twin twin;
  twin.fn = fn;
  twin.param_sizes.assign(param_sizes, param_sizes + param_count);
  std::lock_guard<std::mutex> lock(standin::g_mu);
  standin::Twins()[name] = std::move(twin);
  return 0;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  STANDIN_REQUIRE_INIT();
  if (module == nullptr || image == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "module or image is NULL");
  }
  int device = 0;
  // CUDA Driver API, Module Management, cuModuleLoadData: loads into the current context.
  const CUresult ctx = standin::CurrentDevice(__func__, &device);
  if (ctx != CUDA_SUCCESS) return ctx;
  auto* m = new CUmod_st();  // never freed: a stale handle must stay recognizable
  m->device = device;
  std::lock_guard<std::mutex> lock(standin::g_mu);
  standin::Modules()[m] = m;
  *module = m;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  STANDIN_REQUIRE_INIT();
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto it = standin::Modules().find(hmod);
  if (it == standin::Modules().end() || !it->second->loaded) {
    return Fail(CUDA_ERROR_INVALID_HANDLE, __func__, "not a loaded module");
  }
  it->second->loaded = false;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  STANDIN_REQUIRE_INIT();
  if (hfunc == nullptr || name == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "hfunc or name is NULL");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto it = standin::Modules().find(hmod);
  if (it == standin::Modules().end() || !it->second->loaded) {
    return Fail(CUDA_ERROR_INVALID_HANDLE, __func__, "not a loaded module");
  }
  CUmod_st* m = it->second;
  auto twin = standin::Twins().find(name);
  // CUDA Driver API, Module Management, cuModuleGetFunction: CUDA_ERROR_NOT_FOUND when the
  // module has no function of that name (here: no host twin registered under it).
  if (twin == standin::Twins().end()) {
    return Fail(CUDA_ERROR_NOT_FOUND, __func__,
                std::string("no kernel named ") + name +
                    " (register its host twin with stash_standin_register_kernel)");
  }
  CUfunc_st*& f = m->functions[name];
  if (f == nullptr) {
    f = new CUfunc_st();
    standin::Functions()[f] = f;
  }
  f->name = name;
  f->fn = twin->second.fn;
  f->param_sizes = twin->second.param_sizes;
  f->module = m;
  *hfunc = f;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                void** extra) {
  STANDIN_REQUIRE_INIT();
  int device = 0;
  const CUresult ctx = standin::CurrentDevice(__func__, &device);
  if (ctx != CUDA_SUCCESS) return ctx;
  StashStandinKernel fn = nullptr;
  std::vector<size_t> sizes;
  std::string name;
  {
    std::lock_guard<std::mutex> lock(standin::g_mu);
    auto it = standin::Functions().find(f);
    if (it == standin::Functions().end()) {
      return Fail(CUDA_ERROR_INVALID_HANDLE, __func__, "not a function of the stand-in");
    }
    if (!it->second->module->loaded) {
      return Fail(CUDA_ERROR_INVALID_HANDLE, __func__,
                  "function " + it->second->name + " belongs to an unloaded module");
    }
    fn = it->second->fn;
    sizes = it->second->param_sizes;
    name = it->second->name;
  }
  // CUDA Driver API, Execution Control, cuLaunchKernel: the block may hold at most
  // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK (1024) threads; dimensions are at least 1.
  const uint64_t threads = uint64_t{blockDimX} * blockDimY * blockDimZ;
  if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || threads == 0 || threads > 1024) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                name + ": empty grid or block, or more than 1024 threads per block");
  }
  if (gridDimY != 1 || gridDimZ != 1 || blockDimY != 1 || blockDimZ != 1) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                name + ": the stand-in's twins take x dimensions only (y and z must be 1)");
  }
  (void)sharedMemBytes;
  if (extra != nullptr) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "the extra parameter buffer is not modelled; pass kernelParams");
  }
  if (!sizes.empty() && kernelParams == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, name + ": kernelParams is NULL");
  }
  // cuLaunchKernel: "the kernel parameters will be copied from kernelParams" at the call, so
  // the caller's storage may go away before the kernel runs: copy now.
  auto args = std::make_shared<std::vector<std::vector<unsigned char>>>();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto* from = static_cast<const unsigned char*>(kernelParams[i]);
    args->emplace_back(from, from + sizes[i]);
  }
  const unsigned grid = gridDimX;
  const unsigned block = blockDimX;
  // A host that is slow between two launches (a preempted thread): another thread's work may
  // reach the stream in between, unless the caller orders its launches itself.
  if (standin::config().launch_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(standin::config().launch_delay_us));
  }
  return standin::Enqueue(__func__, hStream, [fn, args, grid, block] {
    std::vector<void*> pointers;
    pointers.reserve(args->size());
    for (std::vector<unsigned char>& a : *args) pointers.push_back(a.data());
    fn(pointers.data(), grid, block);
  });
}

// ---- Entry points the table resolves that the stand-in does not model ---------------------------

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                        void** data, CUdeviceptr ptr) {
  (void)numAttributes;
  (void)attributes;
  (void)data;
  (void)ptr;
  STANDIN_NOT_MODELLED();
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  (void)pHandle;
  (void)dptr;
  STANDIN_NOT_MODELLED();
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                       unsigned int Flags) {
  (void)pdptr;
  (void)handle;
  (void)Flags;
  STANDIN_NOT_MODELLED();
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  (void)dptr;
  STANDIN_NOT_MODELLED();
}

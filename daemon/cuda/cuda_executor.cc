#include "daemon/cuda/cuda_executor.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/bytes.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/host_event.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/range_allocator.h"
#include "common/shm.h"
#include "daemon/cuda/cuda_buffer.h"
#include "daemon/cuda/cuda_chunk_lender.h"
#include "daemon/cuda/paging_kernels.h"
#include "daemon/cuda/pinned_chunk_memory.h"
#include "daemon/cuda/vmm_chunk_memory.h"
#include "daemon/tiers/tier.h"
#include "stash/kernels/daemon_paging_fatbin.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

// Logs a failed clean-up call (destructors cannot return a Status).
void LogIfError(const CudaDriver* driver, CUresult result, const char* expression) {
  const Status st = driver->Check(result, expression);
  if (!st.ok()) Log("ipc")->warn("{}", st.message());
}

// Makes a GPU's primary context current on the calling thread for the guard's life (a push and a
// pop: the thread's own current context comes back after). Lighter than PrimaryContext::Scope,
// which also relaxes the thread's capture mode: stashd never captures, so two driver calls do.
class Current {
 public:
  Current(const CudaDriver* driver, const PrimaryContext& context)
      : driver_(driver),
        status_(driver->Check(driver->CtxPushCurrent(context.get()), "cuCtxPushCurrent")) {}
  Current(const Current&) = delete;
  Current& operator=(const Current&) = delete;
  ~Current() {
    CUcontext popped = nullptr;
    if (status_.ok()) (void)driver_->CtxPopCurrent(&popped);
  }
  const Status& status() const { return status_; }

 private:
  const CudaDriver* driver_;
  Status status_;
};

// A client's cudaMalloc allocation, opened through its IPC handle.
class IpcMemory final : public MappedMemory {
 public:
  IpcMemory(std::shared_ptr<const PrimaryContext> context, const CudaDriver* driver,
            CUdeviceptr base, uint64_t bytes)
      // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, copies take pointers
      : MappedMemory(reinterpret_cast<uint8_t*>(base), nullptr, bytes),
        context_(std::move(context)),
        driver_(driver) {}
  ~IpcMemory() override {
    const Current current(driver_, *context_);
    if (!current.status().ok()) {
      Log("ipc")->warn("a client's CUDA IPC memory is not closed: {}", current.status().message());
      return;
    }
    LogIfError(driver_, driver_->IpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(data())),
               "cuIpcCloseMemHandle");
  }

 private:
  // The executor's GPU context, kept retained while the memory is open.
  const std::shared_ptr<const PrimaryContext> context_;
  const CudaDriver* const driver_;
};

// A client's shared memory (event counters), registered with CUDA so the stream can write it.
class RegisteredShm final : public MappedMemory {
 public:
  RegisteredShm(std::shared_ptr<const PrimaryContext> context, const CudaDriver* driver,
                std::unique_ptr<SharedMemory> shm, uint8_t* device_address)
      : MappedMemory(device_address, shm->data(), shm->size()),
        context_(std::move(context)),
        driver_(driver),
        shm_(std::move(shm)) {}
  ~RegisteredShm() override {
    const Current current(driver_, *context_);
    if (!current.status().ok()) {
      Log("ipc")->warn("a client's host memory stays registered: {}", current.status().message());
      return;
    }
    LogIfError(driver_, driver_->MemHostUnregister(shm_->data()), "cuMemHostUnregister");
  }

 private:
  const std::shared_ptr<const PrimaryContext> context_;
  const CudaDriver* const driver_;
  std::unique_ptr<SharedMemory> shm_;
};

// A done counter in host memory to raise from the CPU as well, for CPU waiters.
struct Wake {
  uint64_t* counter;
  uint64_t value;
};

class CudaExecutor final : public CopyExecutor {
 public:
  // `host_pages` of the host tier for this GPU, its memfd chunks made with `host_memory`.
  static StatusOr<std::unique_ptr<CudaExecutor>> Create(int device, const DaemonConfig& config,
                                                        uint64_t host_pages,
                                                        const ChunkMemoryOptions& host_memory,
                                                        const CudaDriver* driver);
  ~CudaExecutor() override {
    if (stream_ == nullptr) return;
    const Current current(driver_, *context_);
    if (!current.status().ok()) return;
    LogIfError(driver_, driver_->StreamSynchronize(stream_), "cuStreamSynchronize");
    lender_.reset();
    host_lender_.reset();
    kernels_.reset();
    LogIfError(driver_, driver_->StreamDestroy(stream_), "cuStreamDestroy");
  }

  Tier* device_tier() const override { return device_tier_.get(); }
  Tier* host_tier() const override { return host_tier_.get(); }
  void Attach(std::function<void(Then)> post) override { post_ = std::move(post); }

  StatusOr<std::unique_ptr<MappedMemory>> Open(const v1::RegisterMemory& reg, UniqueFd fd) override;
  void Stash(const StashWork& work, Then then) override;
  void Reload(const ReloadWork& work, Then then) override;
  void Raise(const DoneSignal& done) override;
  void Fence(Then then) override;
  void CheckHealth() override;

  // The GPU's 16-byte UUID (cuDeviceGetUuid), as RegisterMemory.device_uuid carries it.
  const CUuuid& raw_uuid() const { return raw_uuid_; }
  // What the groups' depots borrow (CudaGpuOf).
  CudaGpu gpu() const {
    CudaGpu g;
    g.device = device_;
    g.driver = driver_;
    g.context = context_.get();
    g.stream = stream_;
    g.kernels = kernels_.get();
    g.uuid.assign(reinterpret_cast<const char*>(raw_uuid_.bytes), 16);
    return g;
  }

 private:
  CudaExecutor(int device, const CudaDriver* driver, PrimaryContext context, std::string uuid)
      : device_(device),
        driver_(driver),
        context_(std::make_shared<const PrimaryContext>(std::move(context))),
        uuid_(std::move(uuid)) {}

  // Enqueues a host function that posts `then` to the pool worker. Context current.
  void After(Then then);
  // On the copy path, a context that cannot be made current is the device lost.
  void MustBeCurrent(const Current& current) const {
    if (!current.status().ok()) DeviceLost(device_, current.status().message());
  }
  kernels::CudaTier DeviceTier() const {
    return {d_device_ring_, pool_ != nullptr ? pool_->base() : plain_pool_.device<uint8_t>()};
  }
  kernels::CudaTier HostTier() const {
    if (host_tier_ == nullptr) return {};
    return {host_ring_.device<kernels::PageRing>(), host_memory_->base()};
  }
  // Creates the pool's chunks (those the GPU has room for; the others wait, out of the ring),
  // writes the ring and sets up the device tier and its lender. Context current; the ring's
  // buffer allocated for `pages` ids.
  Status StartPool(uint64_t pages, const std::string& name);
  // Gives a record's slot and page-record range back (worker thread).
  void FreeSlot(StashRecord& record);
  std::string Name() const { return "gpu" + std::to_string(device_) + " (" + uuid_ + ")"; }

  // Never change after Create(). The context first: it outlives every buffer below.
  const int device_;
  const CudaDriver* const driver_;
  // Shared with the client memory opened in it, which may be closed after the executor is gone.
  const std::shared_ptr<const PrimaryContext> context_;
  const std::string uuid_;  // "GPU-...", as nvidia-smi spells it
  CUuuid raw_uuid_{};
  uint64_t page_bytes_ = 0;
  CUstream stream_ = nullptr;
  std::unique_ptr<PagingKernels> kernels_;
  std::unique_ptr<Tier> device_tier_;
  std::unique_ptr<Tier> host_tier_;                 // null = no spill tier on this GPU
  std::unique_ptr<VmmChunkMemory> pool_;            // device pages, in chunks
  std::unique_ptr<CudaChunkLender> lender_;         // lends pool_'s chunks to mapped sessions
  std::unique_ptr<PinnedChunkMemory> host_memory_;  // this GPU's share of the host tier
  std::unique_ptr<CudaChunkLender> host_lender_;    // lends host_memory_'s chunks
  CudaBuffer plain_pool_;   // instead of pool_ on a GPU setup without VMM or POSIX-fd handles
  CudaBuffer device_ring_;  // PageRing, then the ids
  kernels::PageRing* d_device_ring_ = nullptr;
  CudaBuffer host_ring_;             // device: the host tier's PageRing, then its ids
  CudaBuffer plans_;                 // device: one StashPlan per slot
  CudaBuffer plan_copies_;           // pinned: the plan of each slot, copied back after the stash
  CudaBuffer records_;               // device: the page-record arena
  uint64_t max_record_entries_ = 0;  // the most pages one stash can take

  // Touched only on the pool worker thread.
  std::function<void(Then)> post_;
  std::vector<Wake> wakes_;  // raised since the last continuation; ride on the next one
  std::vector<int64_t> free_slots_;
  std::unique_ptr<RangeAllocator> record_space_;
};

StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(int device, const DaemonConfig& config,
                                                             uint64_t host_pages,
                                                             const ChunkMemoryOptions& host_memory,
                                                             const CudaDriver* driver) {
  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(driver, device));
  STASH_ASSIGN_OR_RETURN(std::string uuid, GpuUuid(driver, device));
  std::unique_ptr<CudaExecutor> e(
      new CudaExecutor(device, driver, std::move(context), std::move(uuid)));
  const Current current(driver, *e->context_);
  STASH_RETURN_IF_ERROR(current.status());
  const CUcontext ctx = e->context_->get();
  CUdevice cu_device = 0;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&cu_device, device));
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGetUuid(&e->raw_uuid_, cu_device));
  const std::string name = e->Name();
  const uint64_t page = config.page_bytes;
  uint64_t pages = config.pool_bytes / page;
  e->page_bytes_ = page;

  int mem_ops = 0;
  STASH_CU_RETURN_IF_ERROR(
      driver,
      DeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_device));
  if (mem_ops == 0) {
    return FailedPreconditionError(
        name +
        " does not support 64-bit stream memory operations (cuStreamBatchMemOp), which "
        "stashd uses for done events: drivers for CUDA 12 and newer (R525+) offer them by "
        "default; an older driver needs the nvidia kernel module loaded with "
        "NVreg_EnableStreamMemOPs=1");
  }

  // A pool larger than the GPU can never fit. One larger than its free memory now starts with
  // the chunks that fit (the others wait): stashd checked the free memory before
  // (daemon/startup/memory_fit.h), counting a killed predecessor's pool, whose chunks its ranks may
  // still map.
  size_t free_bytes = 0, total_bytes = 0;
  STASH_CU_RETURN_IF_ERROR(driver, MemGetInfo(&free_bytes, &total_bytes));
  if (pages * page > total_bytes) {
    return ResourceExhaustedError(name + " has " + FormatBytes(total_bytes) + " in all (" +
                                  FormatBytes(free_bytes) + " free), less than --pool-bytes " +
                                  FormatBytes(pages * page) + ": lower --pool-bytes");
  }
  STASH_CU_RETURN_IF_ERROR(driver, StreamCreate(&e->stream_, CU_STREAM_NON_BLOCKING));
  auto kernels = PagingKernels::Load(driver, stash_daemon_paging_fatbin);
  if (!kernels.ok()) {
    int major = 0, minor = 0;
    (void)driver->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                     cu_device);
    (void)driver->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                     cu_device);
    return Status(kernels.status().code(),
                  name + " (compute capability " + std::to_string(major) + "." +
                      std::to_string(minor) + ") cannot load stashd's kernels, built for " +
                      STASH_CUDA_ARCHITECTURES +
                      " (CMAKE_CUDA_ARCHITECTURES): " + kernels.status().message() +
                      "; rebuild with this GPU's architecture, or update the driver when it "
                      "is older than the CUDA toolkit stashd was built with");
  }
  e->kernels_ = std::move(kernels).value();

  // The pool: one VMM allocation per chunk in one reserved range (addresses never move), so one
  // pool serves daemon-copy's ring and mapped sessions' leases. Chunks the GPU has no room for
  // now wait, out of the ring, until Leases renews them.
  // A GPU setup without VMM allocations or POSIX-fd handles (some vGPU and MIG setups) gets
  // one cuMemAlloc instead: daemon-copy works, and the pool lends no chunks.
  auto chunked = VmmChunkMemory::Create(driver, device, "gpu" + std::to_string(device),
                                        pages * page, ChunkPages(config) * page, page);
  if (chunked.ok()) {
    e->pool_ = std::move(chunked).value();
    pages = e->pool_->bytes() / page;
  } else if (chunked.status().code() == StatusCode::kFailedPrecondition) {
    Log("pool")->warn("{}: {}; its pool is one cuMemAlloc and lends mapped sessions no chunks",
                      name, chunked.status().message());
    STASH_RETURN_IF_ERROR(
        e->plain_pool_.Allocate(driver, ctx, CudaBuffer::Kind::kDevice, pages * page, "the pool"));
  } else {
    return chunked.status();
  }
  // What the daemon needs beside the pool comes first (the ring, the host tier's share, plans
  // and page records), then as many chunks as the GPU has room for.
  STASH_RETURN_IF_ERROR(e->device_ring_.Allocate(driver, ctx, CudaBuffer::Kind::kDevice,
                                                 sizeof(kernels::PageRing) + pages * 8,
                                                 "the pool's ring"));
  std::vector<uint64_t> ids(host_pages);
  std::iota(ids.begin(), ids.end(), uint64_t{0});

  // This GPU's share of the host tier: memfd chunks page-locked and mapped for the GPU, cut as
  // the pool's chunks are (a session's slots take chunks of one size). Its ring lives in device
  // memory: the copy kernels read a page id per chunk and would otherwise read them across PCIe.
  if (host_pages > 0) {
    const uint64_t host_chunk =
        e->pool_ != nullptr ? e->pool_->chunk_bytes() : ChunkPages(config) * page;
    STASH_ASSIGN_OR_RETURN(
        e->host_memory_, PinnedChunkMemory::Create(driver, device, "host" + std::to_string(device),
                                                   host_pages * page, host_chunk, host_memory));
    STASH_RETURN_IF_ERROR(e->host_ring_.Allocate(driver, ctx, CudaBuffer::Kind::kDevice,
                                                 sizeof(kernels::PageRing) + host_pages * 8,
                                                 "the host tier's ring"));
    auto* d_host_ring = e->host_ring_.device<kernels::PageRing>();
    auto* d_host_ids = reinterpret_cast<uint64_t*>(d_host_ring + 1);
    const kernels::PageRing host_ring{d_host_ids, host_pages, 0, host_pages};
    STASH_CU_RETURN_IF_ERROR(driver, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_host_ring),
                                                &host_ring, sizeof(host_ring)));
    STASH_CU_RETURN_IF_ERROR(
        driver, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_host_ids), ids.data(), host_pages * 8));
    // In chunks only where they are lent (a VMM pool: its chunk size is every session's slot).
    e->host_tier_ = Tier::CreateAccounting("host" + std::to_string(device), device, page,
                                           host_pages, e->pool_ != nullptr ? host_chunk / page : 0,
                                           e->host_memory_->memory());
  }

  // Plans and page records of live stashes. A stash's page record never exceeds the larger
  // tier; the arena holds every page of both tiers plus room for the reservations in flight.
  const uint64_t slots = pages + host_pages + 4096;
  e->max_record_entries_ = std::max(pages, host_pages);
  const uint64_t arena = 2 * (pages + host_pages) + 65536;
  STASH_RETURN_IF_ERROR(e->plans_.Allocate(driver, ctx, CudaBuffer::Kind::kDevice,
                                           slots * sizeof(kernels::StashPlan), "the plan slots"));
  STASH_RETURN_IF_ERROR(e->plan_copies_.Allocate(driver, ctx, CudaBuffer::Kind::kPinnedMapped,
                                                 slots * sizeof(kernels::StashPlan),
                                                 "the plans' pinned copies"));
  STASH_RETURN_IF_ERROR(
      e->records_.Allocate(driver, ctx, CudaBuffer::Kind::kDevice, arena * 8, "the page records"));
  e->free_slots_.resize(slots);
  for (uint64_t i = 0; i < slots; ++i) e->free_slots_[i] = static_cast<int64_t>(slots - 1 - i);
  e->record_space_ = std::make_unique<RangeAllocator>(arena);

  STASH_RETURN_IF_ERROR(e->StartPool(pages, name));
  STASH_CU_RETURN_IF_ERROR(driver, CtxSynchronize());
  Log("pool")->info("{}: pool {} in {} pages, host tier share {}{}", name,
                    FormatBytes(pages * page), pages, FormatBytes(host_pages * page),
                    e->host_memory_ == nullptr
                        ? std::string()
                        : std::string(" in ") + PageKindName(e->host_memory_->page_kind()) +
                              (e->host_lender_ != nullptr ? ", lent to mapped sessions" : ""));
  return e;
}

Status CudaExecutor::StartPool(uint64_t pages, const std::string& name) {
  d_device_ring_ = device_ring_.device<kernels::PageRing>();
  auto* d_ids = reinterpret_cast<uint64_t*>(d_device_ring_ + 1);
  if (pool_ == nullptr) {
    // One cuMemAlloc: every page present, no chunks, no lender.
    device_tier_ =
        Tier::CreateAccounting("gpu" + std::to_string(device_), device_, page_bytes_, pages);
    std::vector<uint64_t> ids(pages);
    std::iota(ids.begin(), ids.end(), uint64_t{0});
    const kernels::PageRing ring{d_ids, pages, 0, pages};
    STASH_CU_RETURN_IF_ERROR(
        driver_, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_device_ring_), &ring, sizeof(ring)));
    STASH_CU_RETURN_IF_ERROR(
        driver_, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_ids), ids.data(), pages * 8));
    return Status::Ok();
  }
  const uint64_t chunk_pages = pool_->chunk_bytes() / page_bytes_;
  device_tier_ = Tier::CreateAccounting("gpu" + std::to_string(device_), device_, page_bytes_,
                                        pages, chunk_pages);
  CudaChunkLender::Pool lent;
  lent.driver = driver_;
  lent.context = context_.get();
  lent.stream = stream_;
  lent.kernels = kernels_.get();
  lent.d_ring = d_device_ring_;
  lent.memory = pool_.get();
  lent.tier = device_tier_.get();
  lent.gpu_uuid.assign(reinterpret_cast<const char*>(raw_uuid_.bytes), 16);
  STASH_ASSIGN_OR_RETURN(lender_, CudaChunkLender::Create(lent));
  device_tier_->SetLender(lender_.get());
  // The host tier's share lends its chunks beside the pool's (to this GPU's sessions only).
  if (host_tier_ != nullptr) {
    CudaChunkLender::Pool host = lent;
    host.d_ring = host_ring_.device<kernels::PageRing>();
    host.memory = host_memory_.get();
    host.tier = host_tier_.get();
    host.gpu_uuid.clear();  // host memory: the rank maps it on whichever GPU it pages with
    STASH_ASSIGN_OR_RETURN(host_lender_, CudaChunkLender::Create(host));
    host_tier_->SetLender(host_lender_.get());
    host_lender_->SetWaiting({});
  }

  std::vector<uint64_t> present;
  std::vector<uint64_t> waiting;
  for (uint64_t c = 0; c < pool_->chunks(); ++c) {
    const Status made = pool_->Ensure(c);
    if (made.code() == StatusCode::kResourceExhausted) {
      waiting.push_back(c);
      continue;
    }
    STASH_RETURN_IF_ERROR(made);
    const uint64_t first = c * chunk_pages;
    for (uint64_t p = first; p < std::min(pages, first + chunk_pages); ++p) present.push_back(p);
  }
  if (present.empty()) {
    return ResourceExhaustedError(name + " has no room for a single chunk of the pool (" +
                                  FormatBytes(pool_->chunk_bytes()) +
                                  "): lower --pool-bytes or --chunk-bytes, or free the GPU");
  }
  if (!waiting.empty()) {
    Log("pool")->warn(
        "{}: {} of {} chunks of the pool have no room on the GPU yet (ranks of an earlier "
        "stashd may still map its chunks, or other processes use the GPU); they join the pool "
        "as memory frees",
        name, waiting.size(), pool_->chunks());
  }
  lender_->SetWaiting(waiting);
  // The ring: the present chunks' page ids, all free. The first state goes up with synchronous
  // copies; the caller's cuCtxSynchronize waits until they landed (a pageable copy may return
  // first).
  const kernels::PageRing ring{d_ids, pages, 0, present.size()};
  STASH_CU_RETURN_IF_ERROR(
      driver_, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_device_ring_), &ring, sizeof(ring)));
  STASH_CU_RETURN_IF_ERROR(driver_, MemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_ids), present.data(),
                                               present.size() * 8));
  return Status::Ok();
}

StatusOr<std::unique_ptr<MappedMemory>> CudaExecutor::Open(const v1::RegisterMemory& reg,
                                                           UniqueFd fd) {
  const Current current(driver_, *context_);
  STASH_RETURN_IF_ERROR(current.status());
  if (reg.kind() == v1::MEMORY_KIND_HOST_FD) {
    STASH_ASSIGN_OR_RETURN(auto shm, SharedMemory::MapClientFd(std::move(fd), reg.bytes()));
    STASH_CU_RETURN_IF_ERROR(
        driver_, MemHostRegister(shm->data(), shm->size(),
                                 CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CUdeviceptr device_address = 0;
    const Status mapped =
        driver_->Check(driver_->MemHostGetDevicePointer(&device_address, shm->data(), 0),
                       "cuMemHostGetDevicePointer");
    if (!mapped.ok()) {
      LogIfError(driver_, driver_->MemHostUnregister(shm->data()), "cuMemHostUnregister");
      return mapped;
    }
    // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, copies take pointers
    auto* device_bytes = reinterpret_cast<uint8_t*>(device_address);
    return std::unique_ptr<MappedMemory>(
        std::make_unique<RegisteredShm>(context_, driver_, std::move(shm), device_bytes));
  }
  if (reg.kind() != v1::MEMORY_KIND_CUDA_IPC) {
    return InvalidArgumentError(
        "the cuda backend opens MEMORY_KIND_CUDA_IPC and "
        "MEMORY_KIND_HOST_FD memory only");
  }
  CUipcMemHandle handle;
  if (reg.handle().size() != sizeof(handle)) {
    return InvalidArgumentError("a CUDA IPC memory handle is " + std::to_string(sizeof(handle)) +
                                " bytes, not " + std::to_string(reg.handle().size()));
  }
  if (!reg.device_uuid().empty() &&
      (reg.device_uuid().size() != 16 ||
       std::memcmp(reg.device_uuid().data(), raw_uuid_.bytes, 16) != 0)) {
    return FailedPreconditionError(
        "the memory lives on another GPU than this session's pool " + uuid_ +
        ": open the session on the GPU that holds the buffers (Options.device)");
  }
  std::memcpy(&handle, reg.handle().data(), sizeof(handle));
  CUdeviceptr base = 0;
  const CUresult opened =
      driver_->IpcOpenMemHandle(&base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (opened != CUDA_SUCCESS) {
    return FailedPreconditionError(
        driver_->Check(opened, "cuIpcOpenMemHandle").message() +
        ": the client and stashd must see the same GPU and run in distinct PID namespaces or "
        "share one (containers: --pid=host or a shared pid namespace, and a shared /dev/shm)");
  }
  auto memory = std::make_unique<IpcMemory>(context_, driver_, base, reg.bytes());
  // Copies trust the registered size: it must not run past the allocation the handle names.
  CUdeviceptr range_base = 0;
  size_t range_bytes = 0;
  STASH_CU_RETURN_IF_ERROR(driver_, MemGetAddressRange(&range_base, &range_bytes, base));
  if (reg.bytes() > range_bytes - (base - range_base)) {
    return InvalidArgumentError(
        "memory declares " + std::to_string(reg.bytes()) + " bytes but its CUDA allocation holds " +
        std::to_string(range_bytes) + ": register the allocation's real size");
  }
  return std::unique_ptr<MappedMemory>(std::move(memory));
}

void CudaExecutor::After(Then then) {
  // One host function per continuation: it also raises, from the CPU, the done counters whose
  // GPU writes were enqueued since the last one (a second host function per operation would
  // serialize the copy stream twice as often: the stream waits for each to return).
  struct Context {
    CudaExecutor* self;
    Then then;
    std::vector<Wake> wakes;
  };
  auto* context = new Context{this, std::move(then), std::move(wakes_)};
  wakes_.clear();
  const CUresult error = driver_->LaunchHostFunc(
      stream_,
      [](void* raw) {
        auto* c = static_cast<Context*>(raw);
        for (const Wake& w : c->wakes) EventSignal(w.counter, w.value);
        c->self->post_(std::move(c->then));
        delete c;
      },
      context);
  if (error != CUDA_SUCCESS) {
    const Status failed = driver_->Check(error, "cuLaunchHostFunc");
    // Work queued before may still be running: `then` (and the wakes) may only run once it
    // finished.
    const CUresult drained = driver_->StreamSynchronize(stream_);
    if (drained != CUDA_SUCCESS) {
      DeviceLost(device_, driver_->Check(drained, "cuStreamSynchronize").message());
    }
    Log("copy")->warn("gpu{}: {}; ran the continuation after draining the stream", device_,
                      failed.message());
    for (const Wake& w : context->wakes) EventSignal(w.counter, w.value);
    post_(std::move(context->then));
    delete context;
  }
}

void CudaExecutor::CheckHealth() {
  const Current current(driver_, *context_);
  if (!current.status().ok()) return;  // reported by the next copy
  const CUresult state = driver_->StreamQuery(stream_);
  if (state != CUDA_SUCCESS && state != CUDA_ERROR_NOT_READY) {
    DeviceLost(device_, driver_->Check(state, "cuStreamQuery(copy stream)").message());
  }
}

void CudaExecutor::Raise(const DoneSignal& done) {
  if (done.memory == nullptr) return;
  const Current current(driver_, *context_);
  MustBeCurrent(current);
  const auto address = reinterpret_cast<CUdeviceptr>(done.memory->data() + done.offset);
  // After the stream's earlier work and a system-scope barrier: the copied bytes are visible
  // before the counter moves.
  const Status st = driver_->WriteValueAfterBarrier(stream_, address, done.value);
  if (!st.ok()) DeviceLost(device_, "raising a done event: " + st.message());
  // A counter in host memory may also have a CPU waiter (WaitEvent sleeps on a futex, which a
  // GPU write does not wake): the next continuation's host function raises it from the CPU too,
  // after the write in stream order (the pool follows every Raise with a Stash, Reload or Fence
  // continuation). Counters only grow, so the second raise is a no-op for the value. The memory
  // outlives that host function: unregistering fences this stream first.
  if (done.memory->host() == nullptr) return;
  wakes_.push_back(
      Wake{reinterpret_cast<uint64_t*>(done.memory->host() + done.offset), done.value});
}

void CudaExecutor::Fence(Then then) {
  const Current current(driver_, *context_);
  MustBeCurrent(current);
  After(std::move(then));
}

void CudaExecutor::FreeSlot(StashRecord& record) {
  if (record.slot < 0) return;
  free_slots_.push_back(record.slot);
  record_space_->Free(record.record_offset, record.record_entries);
  record.slot = -1;
  record.record_entries = 0;
}

void CudaExecutor::Stash(const StashWork& work, Then then) {
  StashRecord& record = *work.record;
  const Current current(driver_, *context_);
  MustBeCurrent(current);
  auto fail = [&](Status status) {
    record.error = std::move(status);
    Raise(work.done);
    After(std::move(then));
  };
  if (free_slots_.empty()) {
    return fail(ResourceExhaustedError("gpu" + std::to_string(device_) +
                                       " holds its maximum of live stashes: reload or release "
                                       "some; nothing was taken"));
  }
  const uint64_t max_bytes = record.max_rows * record.row_bytes;
  const uint64_t entries = std::max<uint64_t>(
      1, std::min(kernels::PagesFor(max_bytes, page_bytes_), max_record_entries_));
  const auto offset = record_space_->Allocate(entries);
  if (!offset) {
    return fail(ResourceExhaustedError(
        "gpu" + std::to_string(device_) +
        "'s page-record space is full (too many live stashes with large max_rows): reload or "
        "release some; nothing was taken"));
  }
  record.slot = free_slots_.back();
  free_slots_.pop_back();
  record.record_offset = *offset;
  record.record_entries = entries;
  const auto slot = static_cast<uint64_t>(record.slot);

  kernels::StashLaunch args;
  args.d_src = work.source;
  args.d_count = reinterpret_cast<const int64_t*>(work.count.data);
  args.count = work.count.value;
  args.divisor = work.count.divisor;
  args.max_rows = record.max_rows;
  args.row_bytes = record.row_bytes;
  args.page_bytes = page_bytes_;
  args.device = DeviceTier();
  if (work.allow_host_spill) args.host = HostTier();
  args.d_page_record = records_.device<uint64_t>() + record.record_offset;
  args.d_plan = plans_.device<kernels::StashPlan>() + slot;
  const kernels::LaunchResult launched = kernels_->Stash(args, stream_);
  if (!launched.ok()) {
    FreeSlot(record);
    return fail(InternalError(std::string("stash launch on gpu") + std::to_string(device_) +
                              " failed: " + launched.message));
  }
  kernels::StashPlan* copy = plan_copies_.host<kernels::StashPlan>() + slot;
  if (const CUresult e = driver_->MemcpyDtoHAsync(copy, reinterpret_cast<CUdeviceptr>(args.d_plan),
                                                  sizeof(kernels::StashPlan), stream_);
      e != CUDA_SUCCESS) {
    // Without its plan the stash's pages cannot be accounted or returned.
    DeviceLost(device_, driver_->Check(e, "cuMemcpyDtoHAsync(plan)").message());
  }
  Raise(work.done);
  After([this, &record, copy, then = std::move(then)] {
    std::memcpy(&record.plan, copy, sizeof(record.plan));
    if (record.plan.placement == kernels::Placement::kDevice) {
      record.tier = device_tier_.get();
    } else if (record.plan.placement == kernels::Placement::kHost) {
      record.tier = host_tier_.get();
    }
    if (record.tier != nullptr) {
      record.tier->AccountAlloc(record.plan.pages, record.plan.bytes);
      // Keep only the page record the stash used.
      const uint64_t used = std::max<uint64_t>(1, record.plan.pages);
      record_space_->Free(record.record_offset + used, record.record_entries - used);
      record.record_entries = used;
    } else {
      FreeSlot(record);
    }
    then();
  });
}

void CudaExecutor::Reload(const ReloadWork& work, Then then) {
  StashRecord& record = *work.record;
  const Current current(driver_, *context_);
  MustBeCurrent(current);
  if (record.slot < 0) {
    // Placed nothing (or already failed): nothing to copy or return.
    Raise(work.done);
    return After(std::move(then));
  }
  kernels::ReloadLaunch args;
  args.d_dst = work.destination;
  args.d_plan = plans_.device<kernels::StashPlan>() + record.slot;
  args.d_page_record = records_.device<uint64_t>() + record.record_offset;
  args.max_rows = record.max_rows;
  args.row_bytes = record.row_bytes;
  args.page_bytes = page_bytes_;
  args.zero_tail = work.zero_tail && work.destination != nullptr;
  args.device = DeviceTier();
  args.host = HostTier();
  const kernels::LaunchResult launched = kernels_->Reload(args, stream_);
  if (!launched.ok()) {
    // The pages stay taken on the device while the record would say they are free: no honest
    // answer is left (the arguments were validated when the stash was planned).
    DeviceLost(device_, std::string("reload launch failed: ") + launched.message);
  }
  Raise(work.done);
  After([this, &record, then = std::move(then)] {
    // The stash's own continuation ran before this one (stream order): the plan is known.
    if (record.tier != nullptr) {
      record.tier->AccountFree(record.plan.pages, record.plan.bytes);
      FreeSlot(record);
    }
    then();
  });
}

}  // namespace

void DeviceLost(int device, const std::string& what) {
  constexpr int kExitDeviceLost = 3;
  Log("copy")->critical(
      "gpu{}: {}: the CUDA context cannot continue; stashd exits with status {} so that every "
      "session fails fast (clients see UNAVAILABLE) and the service manager restarts it",
      device, what, kExitDeviceLost);
  spdlog::shutdown();  // flushes every sink
  std::_Exit(kExitDeviceLost);
}

std::optional<CudaGpu> CudaGpuOf(const CopyExecutor& executor) {
  const auto* cuda = dynamic_cast<const CudaExecutor*>(&executor);
  if (cuda == nullptr) return std::nullopt;
  return cuda->gpu();
}

StatusOr<std::vector<std::unique_ptr<CopyExecutor>>> CreateCudaExecutors(
    const DaemonConfig& config, const CudaDriver* driver, std::vector<std::string>* uuids) {
  if (driver == nullptr) {
    STASH_ASSIGN_OR_RETURN(driver, CudaDriver::Get());
  }
  int count = 0;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGetCount(&count));
  if (count == 0) return FailedPreconditionError("no CUDA device is visible");
  const uint64_t host_pages =
      config.host_tier_bytes / config.page_bytes / static_cast<uint64_t>(count);
  // The host tier's chunks as a host backend makes them; page-locking them for the GPU pins
  // their pages, so --lock-memory adds nothing.
  // (--huge-pages=hugetlb is refused for the cuda backend at start: CheckMemoryFits.)
  ChunkMemoryOptions host_memory;
  host_memory.transparent_huge =
      config.huge_pages == HugePages::kAuto && ShmemHugePagesOffered(ShmemHugePageSetting());
  std::vector<std::unique_ptr<CopyExecutor>> out;
  for (int d = 0; d < count; ++d) {
    auto created = CudaExecutor::Create(d, config, host_pages, host_memory, driver);
    if (!created.ok()) {
      const Status& st = created.status();
      if (st.message().rfind("gpu", 0) == 0) return st;  // names the GPU already
      auto uuid = GpuUuid(driver, d);
      return Status(st.code(), "gpu" + std::to_string(d) + " (" +
                                   (uuid.ok() ? *uuid : std::string("UUID unknown")) +
                                   "): " + st.message() +
                                   (st.code() == StatusCode::kResourceExhausted
                                        ? ": lower --pool-bytes or --host-tier-bytes, or free "
                                          "the GPU"
                                        : ""));
    }
    std::unique_ptr<CudaExecutor> executor = std::move(created).value();
    uuids->emplace_back(executor->raw_uuid().bytes, 16);
    out.push_back(std::move(executor));
  }
  return out;
}

}  // namespace stash::daemon

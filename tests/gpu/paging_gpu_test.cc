// The CUDA paging kernels (paging_cuda.h) against the host functions of paging.h, byte for byte,
// on the matrix of tests/kernels/paging_harness.h: the same tiers, rings, source and
// destination go through HostStash/HostReload and through LaunchStash/LaunchReload, and every
// byte of the tiers, every ring id, head, tail, page record entry, plan field and destination
// byte must agree. The device tier lives in device memory, the host tier in mapped pinned host
// memory, as in the daemon's CUDA backend.
//
// Tests that need a GPU skip when cudaGetDeviceCount fails or finds none; the argument checks
// (CanImplement*) run everywhere because they never touch the GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "paging_harness.h"
#include "stash/kernels/paging.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::kernels::test {
namespace {

// Every CUDA call of these tests: the expression, the CUDA error string, file and line.
#define ASSERT_CUDA_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t stash_cuda_error_ = (expr);                                            \
    ASSERT_EQ(stash_cuda_error_, cudaSuccess)                                                \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_) << " (" << __FILE__ << ":" \
        << __LINE__ << ")";                                                                  \
  } while (0)
#define EXPECT_CUDA_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t stash_cuda_error_ = (expr);                                            \
    EXPECT_EQ(stash_cuda_error_, cudaSuccess)                                                \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_) << " (" << __FILE__ << ":" \
        << __LINE__ << ")";                                                                  \
  } while (0)
#define ASSERT_LAUNCHED(expr)                                                                  \
  do {                                                                                         \
    const LaunchResult stash_launch_ = (expr);                                                 \
    ASSERT_TRUE(stash_launch_.ok()) << #expr << ": " << LaunchStatusName(stash_launch_.status) \
                                    << ": " << stash_launch_.message;                          \
  } while (0)

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

class PagingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_CUDA_OK(cudaStreamDestroy(stream_));
    }
  }
  cudaStream_t stream_ = nullptr;
};

// CUDA memory a test owns: device memory, or pinned host memory mapped into the device (with
// unified addressing the same pointer works on both sides). Freed on destruction.
class CudaMemory {
 public:
  CudaMemory() = default;
  ~CudaMemory() {
    if (ptr_ == nullptr) return;
    if (mapped_host_) {
      EXPECT_CUDA_OK(cudaFreeHost(ptr_));
    } else {
      EXPECT_CUDA_OK(cudaFree(ptr_));
    }
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  cudaError_t Allocate(size_t bytes, bool mapped_host) {
    mapped_host_ = mapped_host;
    bytes_ = std::max<size_t>(bytes, 16);
    void* p = nullptr;
    const cudaError_t error =
        mapped_host ? cudaHostAlloc(&p, bytes_, cudaHostAllocMapped) : cudaMalloc(&p, bytes_);
    if (error == cudaSuccess) ptr_ = static_cast<uint8_t*>(p);
    return error;
  }
  uint8_t* d() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(ptr_);
  }

 private:
  uint8_t* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_host_ = false;
};

// Host to CUDA memory, finished before it returns: a pageable copy may still be in flight when
// cudaMemcpy returns, and the tests' streams do not wait for the legacy stream.
void Upload(const CudaMemory& dst, uint64_t offset, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  ASSERT_CUDA_OK(cudaMemcpy(dst.d() + offset, src, bytes, cudaMemcpyDefault));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

template <typename T>
void Download(std::vector<T>* dst, const void* src, uint64_t count) {
  dst->resize(count);
  if (count == 0) return;
  ASSERT_CUDA_OK(cudaMemcpy(dst->data(), src, count * sizeof(T), cudaMemcpyDefault));
}

// A HostTier mirrored into CUDA memory.
struct GpuTier {
  CudaMemory base;
  CudaMemory ids;
  CudaMemory ring;
  CudaTier view() const { return CudaTier{ring.as<PageRing>(), base.d()}; }
};

// Copies `host`'s bytes, ids, head and tail into `gpu`. A tier too big to copy whole is zeroed
// (as its untouched anonymous memory reads) and gets its watched pages copied.
void MirrorTier(const HostTier& host, bool mapped_host, GpuTier* gpu) {
  const uint64_t pb = host.page_bytes();
  const cudaError_t alloc = gpu->base.Allocate(std::max(host.bytes(), pb), mapped_host);
  if (alloc == cudaErrorMemoryAllocation) {
    GTEST_SKIP() << "cannot allocate a " << host.bytes() << "-byte tier";
  }
  ASSERT_CUDA_OK(alloc);
  if (host.watched().size() == host.capacity()) {
    ASSERT_NO_FATAL_FAILURE(Upload(gpu->base, 0, host.base(), host.bytes()));
  } else {
    ASSERT_FALSE(mapped_host) << "large tiers are device memory in these tests";
    ASSERT_CUDA_OK(cudaMemset(gpu->base.d(), 0, host.bytes()));
    for (uint64_t page : host.watched()) {
      ASSERT_NO_FATAL_FAILURE(Upload(gpu->base, page * pb, host.base() + page * pb, pb));
    }
  }
  ASSERT_CUDA_OK(gpu->ids.Allocate(host.capacity() * sizeof(uint64_t), mapped_host));
  ASSERT_NO_FATAL_FAILURE(
      Upload(gpu->ids, 0, host.ids().data(), host.capacity() * sizeof(uint64_t)));
  ASSERT_CUDA_OK(gpu->ring.Allocate(sizeof(PageRing), mapped_host));
  const PageRing ring{gpu->ids.as<uint64_t>(), host.capacity(), host.ring().head, host.ring().tail};
  ASSERT_NO_FATAL_FAILURE(Upload(gpu->ring, 0, &ring, sizeof(ring)));
}

// The GPU tier equals the host tier: head, tail, every id, every byte of every watched page.
void ExpectSameTier(const HostTier& host, const GpuTier& gpu, const std::string& what) {
  SCOPED_TRACE(what);
  PageRing ring{};
  ASSERT_CUDA_OK(cudaMemcpy(&ring, gpu.ring.d(), sizeof(ring), cudaMemcpyDefault));
  EXPECT_EQ(ring.head, host.ring().head);
  EXPECT_EQ(ring.tail, host.ring().tail);
  EXPECT_EQ(ring.capacity, host.capacity());
  std::vector<uint64_t> ids;
  ASSERT_NO_FATAL_FAILURE(Download(&ids, gpu.ids.d(), host.capacity()));
  EXPECT_EQ(ids, host.ids());
  const uint64_t pb = host.page_bytes();
  std::vector<uint8_t> page(pb);
  for (uint64_t id : host.watched()) {
    ASSERT_CUDA_OK(cudaMemcpy(page.data(), gpu.base.d() + id * pb, pb, cudaMemcpyDefault));
    const uint8_t* want = host.base() + id * pb;
    const auto diff = std::mismatch(page.begin(), page.end(), want);
    ASSERT_TRUE(diff.first == page.end())
        << "page " << id << " byte " << (diff.first - page.begin()) << ": gpu " << int{*diff.first}
        << ", host " << int{*diff.second};
  }
}

void ExpectSamePlan(const StashPlan& gpu, const StashPlan& host) {
  EXPECT_EQ(gpu.placement, host.placement);
  EXPECT_EQ(gpu.rows, host.rows);
  EXPECT_EQ(gpu.bytes, host.bytes);
  EXPECT_EQ(gpu.pages, host.pages);
  EXPECT_EQ(gpu.head, host.head);
}

// One case through the host functions and the CUDA kernels from the same starting state.
// `count_on_device`: the plan kernel reads the count from a device int64 (else a launch value).
void RunParity(const PagingCase& c, bool count_on_device, cudaStream_t stream,
               std::mt19937_64& rng) {
  SCOPED_TRACE("case " + c.name);
  std::unique_ptr<PreparedCase> p = Prepare(c, rng);
  if (!Mapped(*p)) GTEST_SKIP() << "cannot map the host copy of case " << c.name;
  const uint64_t max_bytes = c.geometry.max_bytes();

  // The GPU side, from the same state.
  GpuTier device;
  ASSERT_NO_FATAL_FAILURE(MirrorTier(*p->device, false, &device));
  if (::testing::Test::IsSkipped()) return;
  std::unique_ptr<GpuTier> host;
  if (p->host) {
    host = std::make_unique<GpuTier>();
    ASSERT_NO_FATAL_FAILURE(MirrorTier(*p->host, true, host.get()));
  }
  CudaMemory src, count, record, plan, dst;
  ASSERT_CUDA_OK(src.Allocate(max_bytes + 16, false));
  ASSERT_NO_FATAL_FAILURE(Upload(src, c.src_misalign, p->src, max_bytes));
  ASSERT_CUDA_OK(count.Allocate(sizeof(int64_t), false));
  ASSERT_NO_FATAL_FAILURE(Upload(count, 0, &c.geometry.count, sizeof(int64_t)));
  ASSERT_CUDA_OK(record.Allocate(p->record.size() * sizeof(uint64_t), false));
  ASSERT_NO_FATAL_FAILURE(Upload(record, 0, p->record.data(), p->record.size() * 8));
  ASSERT_CUDA_OK(plan.Allocate(sizeof(StashPlan), false));
  // The destination window: 16 guard bytes, the misalignment, max_bytes, 64 guard bytes.
  const uint64_t window = 16 + max_bytes + 64;
  ASSERT_CUDA_OK(dst.Allocate(16 + window, false));
  const std::vector<uint8_t> untouched(16 + window, kUntouchedDst);
  ASSERT_NO_FATAL_FAILURE(Upload(dst, 0, untouched.data(), untouched.size()));
  uint8_t* d_dst = dst.d() + 16 + c.dst_misalign;

  StashLaunch stash;
  stash.d_src = src.d() + c.src_misalign;
  stash.d_count = count_on_device ? count.as<int64_t>() : nullptr;
  stash.count = count_on_device ? -12345 : c.geometry.count;  // must be ignored when on device
  stash.divisor = c.geometry.divisor;
  stash.max_rows = c.geometry.max_rows;
  stash.row_bytes = c.geometry.row_bytes;
  stash.page_bytes = c.page_bytes;
  stash.device = device.view();
  if (host) stash.host = host->view();
  stash.d_page_record = record.as<uint64_t>();
  stash.d_plan = plan.as<StashPlan>();

  // Stash.
  const StashPlan host_plan =
      HostStash(p->src, c.geometry, c.page_bytes, *p->device, p->host_or_null(), p->record.data());
  ASSERT_LAUNCHED(LaunchStash(stash, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  StashPlan gpu_plan{};
  ASSERT_CUDA_OK(cudaMemcpy(&gpu_plan, plan.d(), sizeof(gpu_plan), cudaMemcpyDefault));
  ASSERT_EQ(host_plan.placement, c.expected);
  ExpectSamePlan(gpu_plan, host_plan);
  std::vector<uint64_t> gpu_record;
  ASSERT_NO_FATAL_FAILURE(Download(&gpu_record, record.d(), p->record.size()));
  EXPECT_EQ(gpu_record, p->record);
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->device, device, "device tier after stash"));
  if (host) {
    ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->host, *host, "host tier after stash"));
  }

  // Reload.
  ReloadLaunch reload;
  reload.d_dst = d_dst;
  reload.d_plan = plan.as<StashPlan>();
  reload.d_page_record = record.as<uint64_t>();
  reload.max_rows = c.geometry.max_rows;
  reload.row_bytes = c.geometry.row_bytes;
  reload.page_bytes = c.page_bytes;
  reload.zero_tail = c.zero_tail;
  reload.device = device.view();
  if (host) reload.host = host->view();
  HostReload(p->dst, host_plan, c.geometry, c.page_bytes, *p->device, p->host_or_null(),
             p->record.data(), c.zero_tail);
  ASSERT_LAUNCHED(LaunchReload(reload, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> gpu_dst;
  ASSERT_NO_FATAL_FAILURE(Download(&gpu_dst, d_dst - c.dst_misalign, window - 16));
  const std::vector<uint8_t> host_dst(p->dst - c.dst_misalign,
                                      p->dst - c.dst_misalign + (window - 16));
  const auto diff = std::mismatch(gpu_dst.begin(), gpu_dst.end(), host_dst.begin());
  EXPECT_TRUE(diff.first == gpu_dst.end())
      << "destination byte "
      << (diff.first - gpu_dst.begin()) - static_cast<int64_t>(c.dst_misalign) << ": gpu "
      << int{*diff.first} << ", host " << int{*diff.second};
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->device, device, "device tier after reload"));
  if (host) {
    ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->host, *host, "host tier after reload"));
  }
}

class PagingGpuMatrix : public ::testing::TestWithParam<PagingCase> {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_CUDA_OK(cudaStreamDestroy(stream_));
    }
  }
  cudaStream_t stream_ = nullptr;
};

TEST_P(PagingGpuMatrix, KernelsMatchHostFunctionsByteForByte) {
  STASH_SEEDED_RNG(rng);
  ASSERT_NO_FATAL_FAILURE(RunParity(GetParam(), true, stream_, rng));
}

TEST_P(PagingGpuMatrix, KernelsMatchHostFunctionsWithTheCountGivenAtLaunch) {
  STASH_SEEDED_RNG(rng);
  ASSERT_NO_FATAL_FAILURE(RunParity(GetParam(), false, stream_, rng));
}

INSTANTIATE_TEST_SUITE_P(AllCases, PagingGpuMatrix, ::testing::ValuesIn(PagingCases()),
                         [](const ::testing::TestParamInfo<PagingCase>& param_info) {
                           return param_info.param.name;
                         });

TEST_F(PagingGpu, UnalignedSourcesAndDestinationsMatchAtEveryOffset) {
  STASH_SEEDED_RNG(rng);
  for (uint64_t misalign = 1; misalign < 16; ++misalign) {
    PagingCase c = FindPagingCase("unaligned_source_and_destination");
    c.src_misalign = misalign;
    c.dst_misalign = (misalign * 5) % 16;
    c.zero_tail = misalign % 2 == 0;
    SCOPED_TRACE(::testing::Message() << "misaligned by " << misalign);
    ASSERT_NO_FATAL_FAILURE(RunParity(c, true, stream_, rng));
  }
}

// A live stash on the GPU, with its own plan, record and source.
struct GpuStash {
  StashGeometry geometry;
  std::vector<uint8_t> src;
  std::vector<uint64_t> record;
  StashPlan host_plan{};
  CudaMemory d_src, d_count, d_record, d_plan;
};

// Stashes and reloads interleaved at random over a device tier and a mapped host tier, some
// spilling and some overflowing: after every step the GPU rings and ids equal the host ones,
// every reload equals the host's, and at the end the tiers' bytes are equal too.
TEST_F(PagingGpu, InterleavedStashesAndReloadsMatchHost) {
  STASH_SEEDED_RNG(rng);
  const uint64_t page_bytes = 256;
  HostTier device(48, page_bytes);
  HostTier host(32, page_bytes);
  device.Permute(rng);
  host.Permute(rng);
  device.FillPattern();
  host.FillPattern();
  GpuTier gpu_device, gpu_host;
  ASSERT_NO_FATAL_FAILURE(MirrorTier(device, false, &gpu_device));
  ASSERT_NO_FATAL_FAILURE(MirrorTier(host, true, &gpu_host));
  std::vector<std::unique_ptr<GpuStash>> live;
  for (int step = 0; step < 120; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    if (live.empty() || (live.size() < 10 && rng() % 3 != 0)) {
      auto s = std::make_unique<GpuStash>();
      s->geometry.row_bytes = 1 + rng() % 200;
      s->geometry.max_rows = 1 + rng() % 96;
      s->geometry.count = static_cast<int64_t>(rng() % (s->geometry.max_rows + 2));
      s->src = RandomBytes(s->geometry.max_bytes(), rng);
      s->record.assign(PagesFor(s->geometry.max_bytes(), page_bytes), kUnwrittenRecord);
      ASSERT_CUDA_OK(s->d_src.Allocate(s->src.size(), false));
      ASSERT_NO_FATAL_FAILURE(Upload(s->d_src, 0, s->src.data(), s->src.size()));
      ASSERT_CUDA_OK(s->d_count.Allocate(sizeof(int64_t), false));
      ASSERT_NO_FATAL_FAILURE(Upload(s->d_count, 0, &s->geometry.count, sizeof(int64_t)));
      ASSERT_CUDA_OK(s->d_record.Allocate(s->record.size() * 8, false));
      ASSERT_CUDA_OK(s->d_plan.Allocate(sizeof(StashPlan), false));
      StashLaunch args;
      args.d_src = s->d_src.d();
      args.d_count = s->d_count.as<int64_t>();
      args.max_rows = s->geometry.max_rows;
      args.row_bytes = s->geometry.row_bytes;
      args.page_bytes = page_bytes;
      args.device = gpu_device.view();
      args.host = gpu_host.view();
      args.d_page_record = s->d_record.as<uint64_t>();
      args.d_plan = s->d_plan.as<StashPlan>();
      s->host_plan =
          HostStash(s->src.data(), s->geometry, page_bytes, device, &host, s->record.data());
      ASSERT_LAUNCHED(LaunchStash(args, stream_));
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));  // before an overflowed stash is freed
      if (s->host_plan.placement != Placement::kOverflow) live.push_back(std::move(s));
    } else {
      const size_t pick = rng() % live.size();
      std::unique_ptr<GpuStash> s = std::move(live[pick]);
      live.erase(live.begin() + static_cast<int64_t>(pick));
      const bool zero_tail = rng() % 2 == 0;
      const uint64_t max_bytes = s->geometry.max_bytes();
      std::vector<uint8_t> host_dst(max_bytes, kUntouchedDst);
      CudaMemory d_dst;
      ASSERT_CUDA_OK(d_dst.Allocate(max_bytes, false));
      ASSERT_NO_FATAL_FAILURE(Upload(d_dst, 0, host_dst.data(), max_bytes));
      ReloadLaunch args;
      args.d_dst = d_dst.d();
      args.d_plan = s->d_plan.as<StashPlan>();
      args.d_page_record = s->d_record.as<uint64_t>();
      args.max_rows = s->geometry.max_rows;
      args.row_bytes = s->geometry.row_bytes;
      args.page_bytes = page_bytes;
      args.zero_tail = zero_tail;
      args.device = gpu_device.view();
      args.host = gpu_host.view();
      HostReload(host_dst.data(), s->host_plan, s->geometry, page_bytes, device, &host,
                 s->record.data(), zero_tail);
      ASSERT_LAUNCHED(LaunchReload(args, stream_));
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
      std::vector<uint8_t> gpu_dst;
      ASSERT_NO_FATAL_FAILURE(Download(&gpu_dst, d_dst.d(), max_bytes));
      ASSERT_EQ(gpu_dst, host_dst);
    }
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
    PageRing ring{};
    ASSERT_CUDA_OK(cudaMemcpy(&ring, gpu_device.ring.d(), sizeof(ring), cudaMemcpyDefault));
    ASSERT_EQ(ring.head, device.ring().head);
    ASSERT_EQ(ring.tail, device.ring().tail);
    ASSERT_CUDA_OK(cudaMemcpy(&ring, gpu_host.ring.d(), sizeof(ring), cudaMemcpyDefault));
    ASSERT_EQ(ring.head, host.ring().head);
    ASSERT_EQ(ring.tail, host.ring().tail);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(device, gpu_device, "device tier"));
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(host, gpu_host, "host tier"));
}

// A release (reload without a destination) returns the pages exactly as the host does and
// copies nothing.
TEST_F(PagingGpu, ReleaseReturnsPagesWithoutCopying) {
  STASH_SEEDED_RNG(rng);
  const PagingCase c = FindPagingCase("permuted_free_list");
  std::unique_ptr<PreparedCase> p = Prepare(c, rng);
  GpuTier device;
  ASSERT_NO_FATAL_FAILURE(MirrorTier(*p->device, false, &device));
  const uint64_t max_bytes = c.geometry.max_bytes();
  CudaMemory src, record, plan;
  ASSERT_CUDA_OK(src.Allocate(max_bytes, false));
  ASSERT_NO_FATAL_FAILURE(Upload(src, 0, p->src, max_bytes));
  ASSERT_CUDA_OK(record.Allocate(p->record.size() * 8, false));
  ASSERT_CUDA_OK(plan.Allocate(sizeof(StashPlan), false));
  StashLaunch stash;
  stash.d_src = src.d();
  stash.count = c.geometry.count;
  stash.max_rows = c.geometry.max_rows;
  stash.row_bytes = c.geometry.row_bytes;
  stash.page_bytes = c.page_bytes;
  stash.device = device.view();
  stash.d_page_record = record.as<uint64_t>();
  stash.d_plan = plan.as<StashPlan>();
  const StashPlan host_plan =
      HostStash(p->src, c.geometry, c.page_bytes, *p->device, nullptr, p->record.data());
  ASSERT_LAUNCHED(LaunchStash(stash, stream_));
  ReloadLaunch release;
  release.d_plan = plan.as<StashPlan>();
  release.d_page_record = record.as<uint64_t>();
  release.max_rows = c.geometry.max_rows;
  release.row_bytes = c.geometry.row_bytes;
  release.page_bytes = c.page_bytes;
  release.device = device.view();
  HostReload(nullptr, host_plan, c.geometry, c.page_bytes, *p->device, nullptr, p->record.data(),
             false);
  ASSERT_LAUNCHED(LaunchReload(release, stream_));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->device, device, "device tier after release"));
  EXPECT_EQ(RingFree(p->device->ring()), p->device->capacity());
}

// A failed CUDA call earlier on the thread (here a refused allocation; in the daemon a refused
// cudaIpcOpenMemHandle or cudaHostRegister) leaves a non-sticky last error behind. Launches are
// checked by their own return value, so it fails neither the stash nor the reload.
TEST_F(PagingGpu, AStaleErrorOfTheThreadFailsNoLaunch) {
  STASH_SEEDED_RNG(rng);
  const PagingCase c = FindPagingCase("permuted_free_list");
  std::unique_ptr<PreparedCase> p = Prepare(c, rng);
  GpuTier device;
  ASSERT_NO_FATAL_FAILURE(MirrorTier(*p->device, false, &device));
  const uint64_t max_bytes = c.geometry.max_bytes();
  CudaMemory src, record, plan;
  ASSERT_CUDA_OK(src.Allocate(max_bytes, false));
  ASSERT_NO_FATAL_FAILURE(Upload(src, 0, p->src, max_bytes));
  ASSERT_CUDA_OK(record.Allocate(p->record.size() * 8, false));
  ASSERT_CUDA_OK(plan.Allocate(sizeof(StashPlan), false));
  StashLaunch stash;
  stash.d_src = src.d();
  stash.count = c.geometry.count;
  stash.max_rows = c.geometry.max_rows;
  stash.row_bytes = c.geometry.row_bytes;
  stash.page_bytes = c.page_bytes;
  stash.device = device.view();
  stash.d_page_record = record.as<uint64_t>();
  stash.d_plan = plan.as<StashPlan>();

  void* huge = nullptr;
  ASSERT_EQ(cudaMalloc(&huge, uint64_t{1} << 62), cudaErrorMemoryAllocation);
  ASSERT_LAUNCHED(LaunchStash(stash, stream_));
  ReloadLaunch release;
  release.d_plan = plan.as<StashPlan>();
  release.d_page_record = record.as<uint64_t>();
  release.max_rows = c.geometry.max_rows;
  release.row_bytes = c.geometry.row_bytes;
  release.page_bytes = c.page_bytes;
  release.device = device.view();
  ASSERT_EQ(cudaMalloc(&huge, uint64_t{1} << 62), cudaErrorMemoryAllocation);
  ASSERT_LAUNCHED(LaunchReload(release, stream_));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  // The ring ends as the host's does after the same stash and release.
  const StashPlan host_plan =
      HostStash(p->src, c.geometry, c.page_bytes, *p->device, nullptr, p->record.data());
  HostReload(nullptr, host_plan, c.geometry, c.page_bytes, *p->device, nullptr, p->record.data(),
             false);
  ASSERT_NO_FATAL_FAILURE(ExpectSameTier(*p->device, device, "device tier after release"));
  (void)cudaGetLastError();  // the refused allocation's, for the tests after this one
}

// Grids depend only on static maxima and the count is read from device memory, so one captured
// graph replays correctly for every count, overflow included.
TEST_F(PagingGpu, CapturedGraphReplaysWithEachNewCount) {
  STASH_SEEDED_RNG(rng);
  const uint64_t page_bytes = 512;
  const StashGeometry base{0, 1, 200, 24};
  HostTier device(16, page_bytes);
  device.Permute(rng);
  device.FillPattern();
  GpuTier gpu_device;
  ASSERT_NO_FATAL_FAILURE(MirrorTier(device, false, &gpu_device));
  const std::vector<uint8_t> src = RandomBytes(base.max_bytes(), rng);
  std::vector<uint64_t> host_record(PagesFor(base.max_bytes(), page_bytes), kUnwrittenRecord);
  std::vector<uint8_t> host_dst(base.max_bytes(), kUntouchedDst);
  CudaMemory d_src, d_count, d_record, d_plan, d_dst;
  ASSERT_CUDA_OK(d_src.Allocate(src.size(), false));
  ASSERT_NO_FATAL_FAILURE(Upload(d_src, 0, src.data(), src.size()));
  ASSERT_CUDA_OK(d_count.Allocate(sizeof(int64_t), false));
  ASSERT_CUDA_OK(d_record.Allocate(host_record.size() * 8, false));
  ASSERT_NO_FATAL_FAILURE(Upload(d_record, 0, host_record.data(), host_record.size() * 8));
  ASSERT_CUDA_OK(d_plan.Allocate(sizeof(StashPlan), false));
  ASSERT_CUDA_OK(d_dst.Allocate(host_dst.size(), false));
  ASSERT_NO_FATAL_FAILURE(Upload(d_dst, 0, host_dst.data(), host_dst.size()));

  StashLaunch stash;
  stash.d_src = d_src.d();
  stash.d_count = d_count.as<int64_t>();
  stash.max_rows = base.max_rows;
  stash.row_bytes = base.row_bytes;
  stash.page_bytes = page_bytes;
  stash.device = gpu_device.view();
  stash.d_page_record = d_record.as<uint64_t>();
  stash.d_plan = d_plan.as<StashPlan>();
  ReloadLaunch reload;
  reload.d_dst = d_dst.d();
  reload.d_plan = d_plan.as<StashPlan>();
  reload.d_page_record = d_record.as<uint64_t>();
  reload.max_rows = base.max_rows;
  reload.row_bytes = base.row_bytes;
  reload.page_bytes = page_bytes;
  reload.zero_tail = true;
  reload.device = gpu_device.view();

  cudaGraph_t graph = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const LaunchResult stash_capture = LaunchStash(stash, stream_);
  const LaunchResult reload_capture = LaunchReload(reload, stream_);
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  ASSERT_TRUE(stash_capture.ok()) << stash_capture.message;
  ASSERT_TRUE(reload_capture.ok()) << reload_capture.message;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int64_t count : {17, 0, 200, 201, 99, 150}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    StashGeometry g = base;
    g.count = count;
    ASSERT_NO_FATAL_FAILURE(Upload(d_count, 0, &count, sizeof(count)));
    const StashPlan host_plan =
        HostStash(src.data(), g, page_bytes, device, nullptr, host_record.data());
    HostReload(host_dst.data(), host_plan, g, page_bytes, device, nullptr, host_record.data(),
               true);
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream_));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
    StashPlan gpu_plan{};
    ASSERT_CUDA_OK(cudaMemcpy(&gpu_plan, d_plan.d(), sizeof(gpu_plan), cudaMemcpyDefault));
    ExpectSamePlan(gpu_plan, host_plan);
    std::vector<uint8_t> gpu_dst;
    ASSERT_NO_FATAL_FAILURE(Download(&gpu_dst, d_dst.d(), host_dst.size()));
    ASSERT_EQ(gpu_dst, host_dst);
    std::vector<uint64_t> gpu_record;
    ASSERT_NO_FATAL_FAILURE(Download(&gpu_record, d_record.d(), host_record.size()));
    ASSERT_EQ(gpu_record, host_record);
    ASSERT_NO_FATAL_FAILURE(ExpectSameTier(device, gpu_device, "device tier"));
  }
  EXPECT_CUDA_OK(cudaGraphExecDestroy(exec));
  EXPECT_CUDA_OK(cudaGraphDestroy(graph));
}

// Three tiers: what the own pool cannot hold goes to the peer tier, then the host tier; a stash
// no tier holds overflows, and its reload copies the source the caller kept (d_kept_src), zeros
// past it (when fewer rows than max_rows came), and returns no pages: an overflowed stash and its
// reload leave both rings and both tiers' bytes as they were.
TEST_F(PagingGpu, APeerTierTakesWhatTheDeviceCannotAndAKeptSourceReloadsAnOverflow) {
  constexpr uint64_t kPage = 256;
  struct Tier {
    CudaMemory base, ids, ring;
    uint64_t pages = 0;
  };
  auto make = [&](Tier* t, uint64_t pages, uint64_t first_id) {
    t->pages = pages;
    ASSERT_CUDA_OK(t->base.Allocate(pages * kPage, false));
    std::vector<uint8_t> bytes(pages * kPage);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13 + pages);
    ASSERT_NO_FATAL_FAILURE(Upload(t->base, 0, bytes.data(), bytes.size()));
    std::vector<uint64_t> ids(pages);
    std::iota(ids.begin(), ids.end(), first_id % pages);
    ASSERT_CUDA_OK(t->ids.Allocate(pages * 8, false));
    ASSERT_NO_FATAL_FAILURE(Upload(t->ids, 0, ids.data(), pages * 8));
    ASSERT_CUDA_OK(t->ring.Allocate(sizeof(PageRing), false));
    const PageRing ring{t->ids.as<uint64_t>(), pages, 0, pages};
    ASSERT_NO_FATAL_FAILURE(Upload(t->ring, 0, &ring, sizeof(ring)));
  };
  // A tier as the GPU holds it: its ring, ids and bytes.
  struct Snapshot {
    PageRing ring{};
    std::vector<uint64_t> ids;
    std::vector<uint8_t> bytes;
  };
  auto snapshot = [](const Tier& t, Snapshot* out) {
    ASSERT_CUDA_OK(cudaMemcpy(&out->ring, t.ring.d(), sizeof(out->ring), cudaMemcpyDefault));
    ASSERT_NO_FATAL_FAILURE(Download(&out->ids, t.ids.d(), t.pages));
    ASSERT_NO_FATAL_FAILURE(Download(&out->bytes, t.base.d(), t.pages * kPage));
  };
  Tier device, peer;
  ASSERT_NO_FATAL_FAILURE(make(&device, 2, 0));
  ASSERT_NO_FATAL_FAILURE(make(&peer, 4, 0));
  // 8 pages at most; the tiers hold 2 and 4, and a stash goes whole into one tier.
  const uint64_t row_bytes = 64, max_rows = 32;
  const uint64_t max_pages = max_rows * row_bytes / kPage;
  std::vector<uint8_t> src(max_rows * row_bytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  CudaMemory d_src, d_dst, d_plan, d_record;
  ASSERT_CUDA_OK(d_src.Allocate(src.size(), false));
  ASSERT_NO_FATAL_FAILURE(Upload(d_src, 0, src.data(), src.size()));
  ASSERT_CUDA_OK(d_dst.Allocate(src.size(), false));
  ASSERT_CUDA_OK(d_plan.Allocate(sizeof(StashPlan), false));
  ASSERT_CUDA_OK(d_record.Allocate(max_pages * 8, false));
  // 12 rows: 3 pages, on the peer. 28 rows: 7 pages, more than any tier has: an overflow with
  // a zero tail of 4 rows. 32 rows: the whole buffer overflows. 40 rows: more than max_rows,
  // an overflow whose kept copy stops at max_rows.
  for (const auto& [rows, want] : {std::pair<int64_t, Placement>{12, Placement::kPeer},
                                   std::pair<int64_t, Placement>{28, Placement::kOverflow},
                                   std::pair<int64_t, Placement>{32, Placement::kOverflow},
                                   std::pair<int64_t, Placement>{40, Placement::kOverflow}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    Snapshot device_before, peer_before;
    ASSERT_NO_FATAL_FAILURE(snapshot(device, &device_before));
    ASSERT_NO_FATAL_FAILURE(snapshot(peer, &peer_before));
    StashLaunch stash;
    stash.d_src = d_src.d();
    stash.count = rows;
    stash.max_rows = max_rows;
    stash.row_bytes = row_bytes;
    stash.page_bytes = kPage;
    stash.device = CudaTier{device.ring.as<PageRing>(), device.base.d()};
    stash.peer = CudaTier{peer.ring.as<PageRing>(), peer.base.d()};
    stash.d_page_record = d_record.as<uint64_t>();
    stash.d_plan = d_plan.as<StashPlan>();
    const LaunchResult s = LaunchStash(stash, stream_);
    ASSERT_TRUE(s.ok()) << s.message;
    std::vector<uint8_t> poison(src.size(), 0xEE);
    ASSERT_NO_FATAL_FAILURE(Upload(d_dst, 0, poison.data(), poison.size()));
    ReloadLaunch reload;
    reload.d_dst = d_dst.d();
    reload.d_kept_src = d_src.d();
    reload.d_plan = d_plan.as<StashPlan>();
    reload.d_page_record = d_record.as<uint64_t>();
    reload.max_rows = max_rows;
    reload.row_bytes = row_bytes;
    reload.page_bytes = kPage;
    reload.zero_tail = true;
    reload.device = stash.device;
    reload.peer = stash.peer;
    const LaunchResult r = LaunchReload(reload, stream_);
    ASSERT_TRUE(r.ok()) << r.message;
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
    StashPlan plan{};
    ASSERT_CUDA_OK(cudaMemcpy(&plan, d_plan.d(), sizeof(plan), cudaMemcpyDefault));
    EXPECT_EQ(plan.placement, want);
    std::vector<uint8_t> back;
    ASSERT_NO_FATAL_FAILURE(Download(&back, d_dst.d(), src.size()));
    const uint64_t valid = std::min<uint64_t>(static_cast<uint64_t>(rows), max_rows) * row_bytes;
    for (uint64_t i = 0; i < back.size(); ++i) {
      ASSERT_EQ(back[i], i < valid ? src[i] : 0) << "byte " << i;
    }
    PageRing ring{};
    ASSERT_CUDA_OK(cudaMemcpy(&ring, peer.ring.d(), sizeof(ring), cudaMemcpyDefault));
    EXPECT_EQ(ring.tail - ring.head, 4u);  // every peer page came back
    if (want == Placement::kOverflow) {
      // Nothing taken, nothing returned, nothing written: both tiers as they were.
      for (const auto& [tier, before, name] : {std::make_tuple(&device, &device_before, "device"),
                                               std::make_tuple(&peer, &peer_before, "peer")}) {
        SCOPED_TRACE(name);
        Snapshot after;
        ASSERT_NO_FATAL_FAILURE(snapshot(*tier, &after));
        EXPECT_EQ(after.ring.head, before->ring.head);
        EXPECT_EQ(after.ring.tail, before->ring.tail);
        EXPECT_EQ(after.ring.capacity, before->ring.capacity);
        EXPECT_EQ(after.ids, before->ids);
        EXPECT_TRUE(after.bytes == before->bytes);
      }
    }
  }
}

// ---- Argument checks: no GPU needed (nothing is dereferenced or launched). ----

// A stash launch whose pointers are valid-looking and never dereferenced.
struct FakeLaunch {
  alignas(16) PageRing device_ring{};
  alignas(16) PageRing host_ring{};
  alignas(16) StashPlan plan{};
  alignas(16) uint8_t bytes[64] = {};
  uint64_t record[4] = {};
  int64_t count = 0;

  StashLaunch Stash() {
    StashLaunch s;
    s.d_src = bytes;
    s.d_count = &count;
    s.max_rows = 4;
    s.row_bytes = 16;
    s.page_bytes = 64;
    s.device = CudaTier{&device_ring, bytes};
    s.d_page_record = record;
    s.d_plan = &plan;
    return s;
  }
  ReloadLaunch Reload() {
    ReloadLaunch r;
    r.d_dst = bytes;
    r.d_plan = &plan;
    r.d_page_record = record;
    r.max_rows = 4;
    r.row_bytes = 16;
    r.page_bytes = 64;
    r.device = CudaTier{&device_ring, bytes};
    return r;
  }
};

TEST(PagingGpuLaunch, CanImplementAcceptsAValidLaunch) {
  FakeLaunch f;
  EXPECT_TRUE(CanImplementStash(f.Stash()).ok()) << CanImplementStash(f.Stash()).message;
  EXPECT_TRUE(CanImplementReload(f.Reload()).ok()) << CanImplementReload(f.Reload()).message;
  StashLaunch with_host = f.Stash();
  with_host.host = CudaTier{&f.host_ring, f.bytes};
  with_host.d_count = nullptr;  // the count given at launch
  with_host.page_bytes = 16;
  EXPECT_TRUE(CanImplementStash(with_host).ok());
  ReloadLaunch release = f.Reload();
  release.d_dst = nullptr;
  EXPECT_TRUE(CanImplementReload(release).ok());
  StashLaunch unaligned_source = f.Stash();
  unaligned_source.d_src = f.bytes + 3;
  EXPECT_TRUE(CanImplementStash(unaligned_source).ok());
}

TEST(PagingGpuLaunch, CanImplementRejectsBadArgumentsWithTheirStatus) {
  FakeLaunch f;
  struct Bad {
    const char* why;
    StashLaunch launch;
    LaunchStatus want;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* why, LaunchStatus want, auto change) {
    StashLaunch s = f.Stash();
    change(s);
    bad.push_back(Bad{why, s, want});
  };
  add("null source", LaunchStatus::kNullPointer, [](StashLaunch& s) { s.d_src = nullptr; });
  add("null record", LaunchStatus::kNullPointer, [](StashLaunch& s) { s.d_page_record = nullptr; });
  add("null plan", LaunchStatus::kNullPointer, [](StashLaunch& s) { s.d_plan = nullptr; });
  add("null device ring", LaunchStatus::kNullPointer,
      [](StashLaunch& s) { s.device.d_ring = nullptr; });
  add("null device base", LaunchStatus::kNullPointer,
      [](StashLaunch& s) { s.device.d_base = nullptr; });
  add("host ring without base", LaunchStatus::kBadTier,
      [&f](StashLaunch& s) { s.host.d_ring = &f.host_ring; });
  add("host base without ring", LaunchStatus::kBadTier,
      [&f](StashLaunch& s) { s.host.d_base = f.bytes; });
  for (uint64_t page_bytes : {0, 1, 8, 24, 48, 100}) {
    add("page_bytes", LaunchStatus::kBadPageBytes,
        [page_bytes](StashLaunch& s) { s.page_bytes = page_bytes; });
  }
  add("row_bytes 0", LaunchStatus::kBadRowBytes, [](StashLaunch& s) { s.row_bytes = 0; });
  add("buffer overflows 64 bits", LaunchStatus::kTooLarge, [](StashLaunch& s) {
    s.max_rows = uint64_t{1} << 40;
    s.row_bytes = uint64_t{1} << 30;
  });
  add("plan misaligned", LaunchStatus::kMisaligned,
      [&f](StashLaunch& s) { s.d_plan = reinterpret_cast<StashPlan*>(f.bytes + 8); });
  add("record misaligned", LaunchStatus::kMisaligned,
      [&f](StashLaunch& s) { s.d_page_record = reinterpret_cast<uint64_t*>(f.bytes + 4); });
  add("ring misaligned", LaunchStatus::kMisaligned,
      [&f](StashLaunch& s) { s.device.d_ring = reinterpret_cast<PageRing*>(f.bytes + 8); });
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.why);
    const LaunchResult checked = CanImplementStash(b.launch);
    EXPECT_EQ(checked.status, b.want)
        << LaunchStatusName(checked.status) << ": " << checked.message;
    EXPECT_NE(checked.message[0], '\0');
    // Launch checks first: it refuses before touching the GPU (no stream is needed).
    EXPECT_EQ(LaunchStash(b.launch, nullptr).status, b.want);
  }

  ReloadLaunch zero_tail_without_dst = f.Reload();
  zero_tail_without_dst.d_dst = nullptr;
  zero_tail_without_dst.zero_tail = true;
  EXPECT_EQ(CanImplementReload(zero_tail_without_dst).status, LaunchStatus::kNullPointer);
  EXPECT_EQ(LaunchReload(zero_tail_without_dst, nullptr).status, LaunchStatus::kNullPointer);
  ReloadLaunch bad_page = f.Reload();
  bad_page.page_bytes = 96;
  EXPECT_EQ(CanImplementReload(bad_page).status, LaunchStatus::kBadPageBytes);
  ReloadLaunch no_plan = f.Reload();
  no_plan.d_plan = nullptr;
  EXPECT_EQ(CanImplementReload(no_plan).status, LaunchStatus::kNullPointer);
  EXPECT_STREQ(LaunchStatusName(LaunchStatus::kMisaligned), "kMisaligned");
}

}  // namespace
}  // namespace stash::kernels::test

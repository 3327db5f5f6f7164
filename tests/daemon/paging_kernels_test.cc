// Daemon-copy's kernels as the cuda backend launches them (daemon/cuda/paging_kernels.h: the fatbin
// through the driver API). Built twice: on a GPU (paging_kernels_gpu_test, label gpu: the real
// fatbin's block kernels), and on the CUDA driver stand-in, which runs each kernel as its host twin
// (tests/cuda_standin/project_twins.cc). The same random stashes and reloads run through the
// host backend's functions (tests/kernels/paging_harness.h), and the two must agree on every
// plan, every reloaded byte and the rings' final order. tests/gpu pins the twins against the
// GPU's kernels.
#include "daemon/cuda/paging_kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/cuda_vmm.h"
#include "stash/kernels/daemon_paging.h"
#include "stash/kernels/daemon_paging_fatbin.h"
#include "tests/cuda_device.h"
#include "tests/kernels/paging_harness.h"
#if !defined(STASH_PAGING_KERNELS_ON_GPU)
#include "tests/vmm_standin.h"
#endif

namespace stash::daemon {
namespace {

using kernels::CudaTier;
using kernels::LaunchStatus;
using kernels::PageRing;
using kernels::Placement;
using kernels::ReloadLaunch;
using kernels::StashLaunch;
using kernels::StashPlan;
using kernels::test::HostReload;
using kernels::test::HostStash;
using kernels::test::HostTier;
using kernels::test::StashGeometry;
#if !defined(STASH_PAGING_KERNELS_ON_GPU)
using stash::testing::Standin;
#endif

constexpr uint64_t kPage = 4096;

// A tier in stand-in device memory (device tier) or device-mapped pinned host memory (host
// tier), with its ring, set up and read back through the driver as the executor does.
class DeviceTier {
 public:
  DeviceTier(const CudaDriver* d, uint64_t pages, bool pinned_host) : d_(d), pages_(pages) {
    if (pinned_host) {
      EXPECT_EQ(d->MemHostAlloc(&host_, pages * kPage,
                                CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
                CUDA_SUCCESS);
      EXPECT_EQ(d->MemHostGetDevicePointer(&base_, host_, 0), CUDA_SUCCESS);
    } else {
      EXPECT_EQ(d->MemAlloc(&base_, pages * kPage), CUDA_SUCCESS);
    }
    EXPECT_EQ(d->MemAlloc(&ring_, sizeof(PageRing) + pages * 8), CUDA_SUCCESS);
    std::vector<uint64_t> ids(pages);
    for (uint64_t i = 0; i < pages; ++i) ids[i] = i;
    const PageRing ring{reinterpret_cast<uint64_t*>(ring_ + sizeof(PageRing)), pages, 0, pages};
    EXPECT_EQ(d->MemcpyHtoD(ring_, &ring, sizeof(ring)), CUDA_SUCCESS);
    EXPECT_EQ(d->MemcpyHtoD(ring_ + sizeof(PageRing), ids.data(), pages * 8), CUDA_SUCCESS);
    EXPECT_EQ(d->CtxSynchronize(), CUDA_SUCCESS);  // a pageable copy may land late
  }
  ~DeviceTier() {
    (void)d_->MemFree(ring_);
    if (host_ != nullptr) {
      (void)d_->MemFreeHost(host_);
    } else {
      (void)d_->MemFree(base_);
    }
  }
  CudaTier tier() const {
    return {reinterpret_cast<PageRing*>(ring_), reinterpret_cast<uint8_t*>(base_)};
  }
  // The ring's head, tail and ids as the device has them (the stream's work done).
  PageRing Ring(std::vector<uint64_t>* ids) const {
    PageRing ring{};
    EXPECT_EQ(d_->MemcpyDtoH(&ring, ring_, sizeof(ring)), CUDA_SUCCESS);
    ids->resize(pages_);
    EXPECT_EQ(d_->MemcpyDtoH(ids->data(), ring_ + sizeof(PageRing), pages_ * 8), CUDA_SUCCESS);
    return ring;
  }

 private:
  const CudaDriver* d_;
  uint64_t pages_;
  CUdeviceptr base_ = 0;
  CUdeviceptr ring_ = 0;
  void* host_ = nullptr;
};

// Device memory the test fills and reads through the driver.
class DeviceBuffer {
 public:
  DeviceBuffer(const CudaDriver* d, uint64_t bytes) : d_(d), bytes_(bytes) {
    EXPECT_EQ(d->MemAlloc(&p_, bytes == 0 ? 16 : bytes), CUDA_SUCCESS);
  }
  ~DeviceBuffer() { (void)d_->MemFree(p_); }
  template <typename T = uint8_t>
  T* get() const {
    return reinterpret_cast<T*>(p_);
  }
  void Write(const void* bytes, uint64_t n, uint64_t at = 0) {
    ASSERT_EQ(d_->MemcpyHtoD(p_ + at, bytes, n), CUDA_SUCCESS);
    ASSERT_EQ(d_->CtxSynchronize(), CUDA_SUCCESS);
  }
  std::vector<uint8_t> Read(uint64_t n, uint64_t at = 0) const {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(d_->MemcpyDtoH(out.data(), p_ + at, n), CUDA_SUCCESS);
    return out;
  }

 private:
  const CudaDriver* d_;
  uint64_t bytes_;
  CUdeviceptr p_ = 0;
};

class PagingKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(STASH_PAGING_KERNELS_ON_GPU)
    std::string why;
    d_ = stash::testing::DriverWithADevice(&why);
    if (d_ == nullptr) GTEST_SKIP() << why;
#else
    d_ = Standin::Reset();
#endif
    auto context = PrimaryContext::Retain(d_, 0);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(context).value());
    ASSERT_EQ(d_->CtxSetCurrent(context_->get()), CUDA_SUCCESS);
    ASSERT_EQ(d_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    auto loaded = PagingKernels::Load(d_, stash_daemon_paging_fatbin);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    kernels_ = std::move(loaded).value();
  }
  void TearDown() override {
    if (d_ == nullptr) return;  // skipped
    if (stream_ != nullptr) {
      EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
      EXPECT_EQ(d_->StreamDestroy(stream_), CUDA_SUCCESS);
    }
    kernels_.reset();
  }
  void Sync() { ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS); }

  const CudaDriver* d_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  CUstream stream_ = nullptr;
  std::unique_ptr<PagingKernels> kernels_;
};

// Random stashes (device counts and counts given at launch, data and columnwise divisors,
// overflows, spills, invalid counts), each reloaded or released in a random order, on a small
// device tier and a host tier: the plans, reloaded bytes, zeroed tails and both rings' final
// order equal what the host backend's functions do with the same operations.
TEST_F(PagingKernelsTest, StashesAndReloadsMatchTheHostRulesByteForByte) {
  STASH_SEEDED_RNG(rng);
  constexpr uint64_t kDevicePages = 24, kHostPages = 16;
  DeviceTier device(d_, kDevicePages, false);
  DeviceTier host(d_, kHostPages, true);
  HostTier ref_device(kDevicePages, kPage);
  HostTier ref_host(kHostPages, kPage);
  ASSERT_TRUE(ref_device.mapped() && ref_host.mapped());

  struct Live {
    StashGeometry g;
    std::vector<uint8_t> src;
    std::unique_ptr<DeviceBuffer> d_src, d_count, d_plan, d_record;
    std::vector<uint64_t> ref_record;
    StashPlan ref_plan;
  };
  std::vector<Live> live;
  int placed = 0, spilled = 0, overflowed = 0, reloads = 0;
  // 160 operations, and on until every outcome was seen (a seed may place no spill in 160).
  for (int op = 0;
       op < 4000 && (op < 160 || placed == 0 || spilled == 0 || overflowed == 0 || reloads == 0);
       ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    if (live.size() < 6 && (live.empty() || rng() % 3 != 0)) {
      Live s;
      s.g.row_bytes = 16 * (1 + rng() % 64);
      s.g.max_rows = 1 + rng() % 96;
      s.g.divisor = rng() % 4 == 0 ? 32 : 1;
      s.g.count = static_cast<int64_t>(rng() % (s.g.max_rows * s.g.divisor + 8)) -
                  (rng() % 16 == 0 ? 40 : 0);  // now and then negative: kInvalidCount
      s.src = kernels::test::RandomBytes(s.g.max_bytes(), rng);
      const uint64_t record_pages =
          std::max<uint64_t>(1, kernels::PagesFor(s.g.max_bytes(), kPage));
      s.d_src = std::make_unique<DeviceBuffer>(d_, s.g.max_bytes());
      s.d_src->Write(s.src.data(), s.src.size());
      s.d_count = std::make_unique<DeviceBuffer>(d_, 8);
      s.d_count->Write(&s.g.count, 8);
      s.d_plan = std::make_unique<DeviceBuffer>(d_, sizeof(StashPlan));
      s.d_record = std::make_unique<DeviceBuffer>(d_, record_pages * 8);
      s.ref_record.assign(record_pages, 0);

      StashLaunch a;
      a.d_src = s.d_src->get();
      const bool device_count = rng() % 2 == 0;
      a.d_count = device_count ? s.d_count->get<int64_t>() : nullptr;
      a.count = device_count ? 0 : s.g.count;
      a.divisor = s.g.divisor;
      a.max_rows = s.g.max_rows;
      a.row_bytes = s.g.row_bytes;
      a.page_bytes = kPage;
      a.device = device.tier();
      a.host = host.tier();
      a.d_page_record = s.d_record->get<uint64_t>();
      a.d_plan = s.d_plan->get<StashPlan>();
      const kernels::LaunchResult launched = kernels_->Stash(a, stream_);
      ASSERT_TRUE(launched.ok()) << launched.message;
      s.ref_plan = HostStash(s.src.data(), s.g, kPage, ref_device, &ref_host, s.ref_record.data());
      Sync();
      StashPlan plan{};
      std::memcpy(&plan, s.d_plan->Read(sizeof(plan)).data(), sizeof(plan));
      ASSERT_EQ(plan.placement, s.ref_plan.placement);
      ASSERT_EQ(plan.pages, s.ref_plan.pages);
      ASSERT_EQ(plan.bytes, s.ref_plan.bytes);
      ASSERT_EQ(plan.head, s.ref_plan.head);
      ASSERT_EQ(plan.rows, s.ref_plan.rows);
      placed += plan.placement == Placement::kDevice;
      spilled += plan.placement == Placement::kHost;
      overflowed += plan.placement == Placement::kOverflow;
      live.push_back(std::move(s));
      continue;
    }
    // A reload (with or without a zeroed tail) or a release of a random live stash.
    const size_t i = rng() % live.size();
    Live s = std::move(live[i]);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    const int kind = static_cast<int>(rng() % 3);  // 0 release, 1 reload, 2 reload + zero tail
    DeviceBuffer dst(d_, s.g.max_bytes());
    std::vector<uint8_t> untouched(s.g.max_bytes(), kernels::test::kUntouchedDst);
    dst.Write(untouched.data(), untouched.size());
    ReloadLaunch r;
    r.d_dst = kind == 0 ? nullptr : dst.get();
    r.d_plan = s.d_plan->get<StashPlan>();
    r.d_page_record = s.d_record->get<uint64_t>();
    r.max_rows = s.g.max_rows;
    r.row_bytes = s.g.row_bytes;
    r.page_bytes = kPage;
    r.zero_tail = kind == 2;
    r.device = device.tier();
    r.host = host.tier();
    const kernels::LaunchResult launched = kernels_->Reload(r, stream_);
    ASSERT_TRUE(launched.ok()) << launched.message;
    std::vector<uint8_t> expected = untouched;
    HostReload(kind == 0 ? nullptr : expected.data(), s.ref_plan, s.g, kPage, ref_device, &ref_host,
               s.ref_record.data(), kind == 2);
    Sync();
    if (kind != 0) {
      ++reloads;
      ASSERT_EQ(dst.Read(s.g.max_bytes()), expected);
    }
  }
  // What the sequence covered, so a change that stops placing or spilling cannot pass quietly.
  EXPECT_GT(placed, 0);
  EXPECT_GT(spilled, 0);
  EXPECT_GT(overflowed, 0);
  EXPECT_GT(reloads, 0);

  std::vector<uint64_t> ids;
  const PageRing d_ring = device.Ring(&ids);
  EXPECT_EQ(d_ring.head, ref_device.ring().head);
  EXPECT_EQ(d_ring.tail, ref_device.ring().tail);
  EXPECT_EQ(ids, ref_device.ids());
  const PageRing h_ring = host.Ring(&ids);
  EXPECT_EQ(h_ring.head, ref_host.ring().head);
  EXPECT_EQ(h_ring.tail, ref_host.ring().tail);
  EXPECT_EQ(ids, ref_host.ids());
}

// A stash that overflowed, reloaded with the source kept (d_kept_src): its rows are copied and
// the tail zeroed; without it the destination stays as it was. No page moves either way.
TEST_F(PagingKernelsTest, AnOverflowedStashReloadsFromItsKeptSource) {
  DeviceTier device(d_, 2, false);
  constexpr uint64_t kRows = 40, kRowBytes = 256;  // a tier of two pages
  std::mt19937_64 rng(7);
  std::vector<uint8_t> src = kernels::test::RandomBytes(kRows * kRowBytes, rng);
  DeviceBuffer d_src(d_, src.size()), d_plan(d_, sizeof(StashPlan)), d_record(d_, 8 * 3);
  d_src.Write(src.data(), src.size());
  StashLaunch a;
  a.d_src = d_src.get();
  a.count = 36;  // 36 of 40 rows: 9 KiB, three pages
  a.max_rows = kRows;
  a.row_bytes = kRowBytes;
  a.page_bytes = kPage;
  a.device = device.tier();
  a.d_page_record = d_record.get<uint64_t>();
  a.d_plan = d_plan.get<StashPlan>();
  ASSERT_TRUE(kernels_->Stash(a, stream_).ok());
  Sync();
  StashPlan plan{};
  std::memcpy(&plan, d_plan.Read(sizeof(plan)).data(), sizeof(plan));
  ASSERT_EQ(plan.placement, Placement::kOverflow);

  DeviceBuffer dst(d_, src.size());
  std::vector<uint8_t> untouched(src.size(), kernels::test::kUntouchedDst);
  dst.Write(untouched.data(), untouched.size());
  ReloadLaunch r;
  r.d_dst = dst.get();
  r.d_plan = d_plan.get<StashPlan>();
  r.d_page_record = d_record.get<uint64_t>();
  r.max_rows = kRows;
  r.row_bytes = kRowBytes;
  r.page_bytes = kPage;
  r.device = device.tier();
  ASSERT_TRUE(kernels_->Reload(r, stream_).ok());
  Sync();
  EXPECT_EQ(dst.Read(src.size()), untouched) << "no kept source: the destination stays";

  r.d_kept_src = d_src.get();
  r.zero_tail = true;
  ASSERT_TRUE(kernels_->Reload(r, stream_).ok());
  Sync();
  std::vector<uint8_t> expected(src.begin(), src.begin() + 36 * kRowBytes);
  expected.resize(src.size(), 0);
  EXPECT_EQ(dst.Read(src.size()), expected);
  std::vector<uint64_t> ids;
  const PageRing ring = device.Ring(&ids);
  EXPECT_EQ(ring.head, 0u);
  EXPECT_EQ(ring.tail, 2u);
}

// Bad arguments are refused by the same checks as the runtime launchers, before anything is
// enqueued: the ring is untouched.
TEST_F(PagingKernelsTest, BadArgumentsAreRefusedBeforeAnythingIsEnqueued) {
  DeviceTier device(d_, 4, false);
  DeviceBuffer src(d_, kPage), d_plan(d_, sizeof(StashPlan)), d_record(d_, 8);
  StashLaunch a;
  a.d_src = src.get();
  a.count = 1;
  a.max_rows = 1;
  a.row_bytes = kPage;
  a.page_bytes = kPage;
  a.device = device.tier();
  a.d_page_record = d_record.get<uint64_t>();
  a.d_plan = d_plan.get<StashPlan>();

  StashLaunch bad = a;
  bad.page_bytes = 3000;
  EXPECT_EQ(kernels_->Stash(bad, stream_).status, LaunchStatus::kBadPageBytes);
  bad = a;
  bad.d_plan = nullptr;
  kernels::LaunchResult refused = kernels_->Stash(bad, stream_);
  EXPECT_EQ(refused.status, LaunchStatus::kNullPointer);
  EXPECT_STREQ(refused.message, "d_plan is null");
  bad = a;
  bad.host.d_ring = device.tier().d_ring;  // a ring without its base
  EXPECT_EQ(kernels_->Stash(bad, stream_).status, LaunchStatus::kBadTier);
  ReloadLaunch r;
  r.d_plan = d_plan.get<StashPlan>();
  r.d_page_record = d_record.get<uint64_t>();
  r.max_rows = 1;
  r.row_bytes = kPage;
  r.page_bytes = kPage;
  r.device = device.tier();
  r.zero_tail = true;  // with no destination
  EXPECT_EQ(kernels_->Reload(r, stream_).status, LaunchStatus::kNullPointer);
  Sync();
  std::vector<uint64_t> ids;
  const PageRing ring = device.Ring(&ids);
  EXPECT_EQ(ring.head, 0u);
  EXPECT_EQ(ring.tail, 4u);
}

// The stand-in finds kernels by name whatever the image, so this checks the image itself: every
// kernel PagingKernels asks for is an entry point of stashd's fatbin (its name is in the
// image's symbol table), spelled as the extern "C" kernels of kernels/daemon_paging.cu are.
TEST(DaemonPagingFatbin, HoldsEveryKernelTheDaemonLaunches) {
  const auto* begin = reinterpret_cast<const char*>(stash_daemon_paging_fatbin);
  const std::string image(begin, begin + stash_daemon_paging_fatbin_size);
  ASSERT_GT(image.size(), 1024u);
  for (const char* name : {kernels::kDaemonStashPlanKernel, kernels::kDaemonStashCopyKernel,
                           kernels::kDaemonStashPublishKernel, kernels::kDaemonReloadPopKernel,
                           kernels::kDaemonReloadPublishKernel, kernels::kDaemonTakeChunksKernel,
                           kernels::kDaemonReturnChunkKernel}) {
    // NUL-terminated in the ELF string table of the machine code, and as ".entry name" in PTX.
    EXPECT_NE(image.find(std::string(name) + '\0'), std::string::npos) << name;
  }
  EXPECT_EQ(image.find(std::string("stash_daemon_no_such_kernel") + '\0'), std::string::npos);
}

}  // namespace
}  // namespace stash::daemon

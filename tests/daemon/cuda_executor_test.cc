// The daemon's cuda backend (daemon/cuda/cuda_executor.cc) on the CUDA driver stand-in
// (tests/cuda_standin): its pool, rings and plans in stand-in device memory, daemon-copy's
// kernels from the fatbin run as their host twins, continuations from host functions on the
// copy stream, done events as stream memory writes. The source and destination here are
// stand-in device memory of this process (a client's arrive through CUDA IPC, which the stand-in
// does not model: its refusal is tested as such).
#include "daemon/cuda/cuda_executor.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/shm.h"
#include "daemon/tiers/tier.h"
#include "tests/kernels/paging_harness.h"
#include "tests/vmm_standin.h"

namespace stash::daemon {
namespace {

using kernels::Placement;
using stash::testing::Standin;

constexpr uint64_t kPage = 64 << 10;
constexpr uint64_t kMiB = 1 << 20;

// The pool worker's queue: the executor posts continuations from its host functions; the test
// runs them on its own thread, in order.
class Worker {
 public:
  void Post(std::function<void()> then) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(then));
    cv_.notify_all();
  }
  // Runs the next continuation; false when none came within 10 s.
  bool RunNext() {
    std::function<void()> then;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !queue_.empty(); })) {
        return false;
      }
      then = std::move(queue_.front());
      queue_.pop_front();
    }
    then();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

class CudaExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = Standin::Reset({{"STASH_STANDIN_DEVICES", "1"}});
    auto context = PrimaryContext::Retain(d_, 0);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(context).value());
  }

  // The executor of the one stand-in GPU, its continuations on worker_, and its event page.
  void Start(uint64_t pool_bytes, uint64_t host_tier_bytes) {
    DaemonConfig config;
    config.page_bytes = kPage;
    config.pool_bytes = pool_bytes;
    config.host_tier_bytes = host_tier_bytes;
    std::vector<std::string> uuids;
    auto created = CreateCudaExecutors(config, d_, &uuids);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ASSERT_EQ(created->size(), 1u);
    ASSERT_EQ(uuids.size(), 1u);
    uuid_ = uuids[0];
    executor_ = std::move((*created)[0]);
    executor_->Attach([this](std::function<void()> then) { worker_.Post(std::move(then)); });

    auto fd = CreateSealedMemfd("cuda-executor-test-events", 4096);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    v1::RegisterMemory reg;
    reg.set_kind(v1::MEMORY_KIND_HOST_FD);
    reg.set_bytes(4096);
    auto events = executor_->Open(reg, std::move(*fd));
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    events_ = std::move(events).value();
  }

  void TearDown() override {
    events_.reset();
    executor_.reset();
    const PrimaryContext::Scope scope(*context_);
    for (CUdeviceptr p : buffers_) EXPECT_EQ(d_->MemFree(p), CUDA_SUCCESS);
  }

  // Stand-in device memory holding `bytes` (written through the driver, landed when it returns).
  uint8_t* DeviceBytes(const std::vector<uint8_t>& bytes) {
    const PrimaryContext::Scope scope(*context_);
    CUdeviceptr p = 0;
    EXPECT_EQ(d_->MemAlloc(&p, bytes.size()), CUDA_SUCCESS);
    EXPECT_EQ(d_->MemcpyHtoD(p, bytes.data(), bytes.size()), CUDA_SUCCESS);
    EXPECT_EQ(d_->CtxSynchronize(), CUDA_SUCCESS);
    buffers_.push_back(p);
    return reinterpret_cast<uint8_t*>(p);
  }
  std::vector<uint8_t> Read(const uint8_t* p, uint64_t n) {
    const PrimaryContext::Scope scope(*context_);
    std::vector<uint8_t> out(n);
    EXPECT_EQ(d_->MemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(p), n), CUDA_SUCCESS);
    return out;
  }
  uint64_t Counter(uint64_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(events_->host() + offset),
                           __ATOMIC_ACQUIRE);
  }

  // One stash of `rows` rows of `row_bytes` from `src`, its continuation run.
  void Stash(StashRecord* record, const uint8_t* src, uint64_t rows, uint64_t row_bytes,
             uint64_t event, bool allow_host_spill = true) {
    record->row_bytes = row_bytes;
    record->max_rows = rows;
    StashWork work;
    work.source = src;
    work.count.value = static_cast<int64_t>(rows);
    work.allow_host_spill = allow_host_spill;
    work.done = DoneSignal{events_.get(), 0, event};
    work.record = record;
    bool ran = false;
    executor_->Stash(work, [&ran] { ran = true; });
    ASSERT_TRUE(worker_.RunNext()) << "the stash's continuation never ran";
    ASSERT_TRUE(ran);
    EXPECT_GE(Counter(0), event) << "the done event is raised before the continuation";
  }
  void Reload(StashRecord* record, uint8_t* dst, uint64_t event) {
    ReloadWork work;
    work.destination = dst;
    work.done = DoneSignal{events_.get(), 8, event};
    work.record = record;
    bool ran = false;
    executor_->Reload(work, [&ran] { ran = true; });
    ASSERT_TRUE(worker_.RunNext()) << "the reload's continuation never ran";
    ASSERT_TRUE(ran);
    EXPECT_GE(Counter(8), event);
  }

  const CudaDriver* d_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  std::vector<CUdeviceptr> buffers_;
  Worker worker_;
  std::string uuid_;
  std::unique_ptr<CopyExecutor> executor_;
  std::unique_ptr<MappedMemory> events_;
};

// Stashes fill the GPU pool, then spill to this GPU's share of the host tier, then overflow;
// each reloads byte-exact, and the tiers' accounting follows the plans the device made.
TEST_F(CudaExecutorTest, StashesFillThePoolSpillThenOverflowAndReloadByteExact) {
  Start(2 * kMiB, 1 * kMiB);  // 32 pool pages, 16 host pages
  ASSERT_NE(executor_->device_tier(), nullptr);
  ASSERT_NE(executor_->host_tier(), nullptr);
  EXPECT_EQ(executor_->device_tier()->pages(), 32u);
  EXPECT_EQ(executor_->host_tier()->pages(), 16u);
  EXPECT_EQ(executor_->device_tier()->base(), nullptr) << "the ring lives on the device";

  std::mt19937_64 rng(11);
  constexpr uint64_t kRowBytes = 4096, kRows = 200;  // 800 KiB: 13 pages
  std::vector<std::vector<uint8_t>> data;
  std::vector<uint8_t*> sources;
  for (int i = 0; i < 4; ++i) {
    data.push_back(kernels::test::RandomBytes(kRows * kRowBytes, rng));
    sources.push_back(DeviceBytes(data.back()));
  }
  StashRecord records[4];
  for (int i = 0; i < 4; ++i) Stash(&records[i], sources[i], kRows, kRowBytes, i + 1);
  EXPECT_EQ(records[0].plan.placement, Placement::kDevice);
  EXPECT_EQ(records[1].plan.placement, Placement::kDevice);
  EXPECT_EQ(records[2].plan.placement, Placement::kHost);  // 26 of 32 pool pages are taken
  EXPECT_EQ(records[3].plan.placement, Placement::kOverflow);
  EXPECT_EQ(records[0].tier, executor_->device_tier());
  EXPECT_EQ(records[2].tier, executor_->host_tier());
  EXPECT_EQ(records[3].tier, nullptr);
  EXPECT_EQ(records[3].slot, -1) << "an overflowed stash keeps no slot";
  EXPECT_EQ(executor_->device_tier()->Snapshot().pages_used, 26u);
  EXPECT_EQ(executor_->host_tier()->Snapshot().pages_used, 13u);

  std::vector<uint8_t> zeros(kRows * kRowBytes, 0);
  for (int i : {2, 0, 1}) {
    uint8_t* dst = DeviceBytes(zeros);
    Reload(&records[i], dst, i + 1);
    EXPECT_EQ(Read(dst, zeros.size()), data[i]) << "stash " << i;
  }
  EXPECT_EQ(executor_->device_tier()->Snapshot().pages_used, 0u);
  EXPECT_EQ(executor_->host_tier()->Snapshot().pages_used, 0u);

  // The pages came back: the pool holds two such stashes again.
  StashRecord again[2];
  Stash(&again[0], sources[3], kRows, kRowBytes, 10);
  Stash(&again[1], sources[3], kRows, kRowBytes, 11);
  EXPECT_EQ(again[0].plan.placement, Placement::kDevice);
  EXPECT_EQ(again[1].plan.placement, Placement::kDevice);
  for (StashRecord& r : again) Reload(&r, nullptr, 12);  // releases
  EXPECT_EQ(executor_->device_tier()->Snapshot().pages_used, 0u);
}

// Without host spill a stash that does not fit the pool overflows; a fence's continuation runs
// after the work before it.
TEST_F(CudaExecutorTest, WithoutHostSpillAStashThatDoesNotFitOverflowsAndFencesKeepOrder) {
  Start(2 * kMiB, 4 * kMiB);
  std::vector<uint8_t> bytes(3 * kMiB, 7);
  uint8_t* src = DeviceBytes(bytes);
  StashRecord record;
  Stash(&record, src, 3, kMiB, 1, /*allow_host_spill=*/false);
  EXPECT_EQ(record.plan.placement, Placement::kOverflow);
  Stash(&record, src, 3, kMiB, 2, /*allow_host_spill=*/true);
  EXPECT_EQ(record.plan.placement, Placement::kHost);

  // A raise is a write on the copy stream: it lands once the stream got there, before any
  // host function (whose CPU wake of the same counter would hide a wrong GPU write).
  executor_->Raise(DoneSignal{events_.get(), 24, 7});
  {
    const PrimaryContext::Scope scope(*context_);
    ASSERT_EQ(d_->CtxSynchronize(), CUDA_SUCCESS);
  }
  EXPECT_EQ(Counter(24), 7u) << "the stream's write";

  std::vector<int> order;
  executor_->Fence([&order] { order.push_back(1); });
  executor_->Raise(DoneSignal{events_.get(), 16, 99});
  executor_->Fence([&order] { order.push_back(2); });
  ASSERT_TRUE(worker_.RunNext());
  ASSERT_TRUE(worker_.RunNext());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(Counter(16), 99u) << "a raise rides on the next continuation at the latest";
  Reload(&record, nullptr, 3);
}

// What the cuda backend refuses, each with what to change: CUDA IPC memory the stand-in cannot
// open (a node whose client and daemon cannot share memory), a handle of the wrong size, memory
// of another GPU, a pool larger than the GPU's free memory, and one smaller than a chunk can be.
TEST_F(CudaExecutorTest, RefusalsSayWhatToChange) {
  Start(2 * kMiB, 0);
  EXPECT_EQ(executor_->host_tier(), nullptr);
  v1::RegisterMemory reg;
  reg.set_kind(v1::MEMORY_KIND_CUDA_IPC);
  reg.set_bytes(4096);
  reg.set_handle(std::string(64, '\0'));
  auto opened = executor_->Open(reg, UniqueFd());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("cuIpcOpenMemHandle"), std::string::npos)
      << opened.status().message();
  EXPECT_NE(opened.status().message().find("pid namespace"), std::string::npos);

  reg.set_handle(std::string(10, '\0'));
  opened = executor_->Open(reg, UniqueFd());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("64 bytes, not 10"), std::string::npos)
      << opened.status().message();

  reg.set_handle(std::string(64, '\0'));
  std::string other = uuid_;
  other[0] = static_cast<char>(other[0] ^ 1);
  reg.set_device_uuid(other);
  opened = executor_->Open(reg, UniqueFd());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("another GPU"), std::string::npos);
  EXPECT_NE(opened.status().message().find("GPU-"), std::string::npos)
      << "names the pool's GPU by its UUID: " << opened.status().message();

  // The stand-in's GPU has 1 GiB (STASH_STANDIN_VRAM_BYTES's default).
  DaemonConfig config;
  config.page_bytes = kPage;
  config.pool_bytes = 4ULL << 30;
  config.host_tier_bytes = 0;
  std::vector<std::string> uuids;
  auto big = CreateCudaExecutors(config, d_, &uuids);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("lower --pool-bytes"), std::string::npos)
      << big.status().message();
  EXPECT_NE(big.status().message().find("gpu0 (GPU-"), std::string::npos) << big.status().message();

  // The stand-in's GPU, like an H100, allocates in units of 2 MiB.
  config.pool_bytes = kMiB;
  auto small = CreateCudaExecutors(config, d_, &uuids);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("granularity"), std::string::npos)
      << small.status().message();
  EXPECT_NE(small.status().message().find("raise --pool-bytes to at least 2 MiB"),
            std::string::npos)
      << small.status().message();
}

// A GPU setup without POSIX-fd VMM handles (some vGPU and MIG setups) still runs daemon-copy:
// its pool is one cuMemAlloc that lends no chunks, and stashes fill it and reload byte-exact.
TEST_F(CudaExecutorTest, AGpuWithoutPosixFdHandlesPoolsInOneAllocationAndLendsNothing) {
  context_.reset();
  d_ = Standin::Reset({{"STASH_STANDIN_DEVICES", "1"}, {"STASH_STANDIN_NO_POSIX_FD", "1"}});
  auto context = PrimaryContext::Retain(d_, 0);
  ASSERT_TRUE(context.ok()) << context.status().ToString();
  context_ = std::make_unique<PrimaryContext>(std::move(context).value());
  Start(kMiB, 0);  // less than a chunk could be: no chunks are made
  Tier* tier = executor_->device_tier();
  EXPECT_EQ(tier->pages(), kMiB / kPage);
  EXPECT_EQ(tier->chunks(), 0u);
  EXPECT_EQ(tier->lender(), nullptr);
  std::vector<uint8_t> bytes(kMiB);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  uint8_t* src = DeviceBytes(bytes);
  StashRecord record;
  Stash(&record, src, 16, kPage, 1);
  EXPECT_EQ(record.plan.placement, Placement::kDevice);
  StashRecord over;
  Stash(&over, src, 1, kPage, 2);
  EXPECT_EQ(over.plan.placement, Placement::kOverflow) << "the whole pool is the first stash's";
  uint8_t* dst = DeviceBytes(std::vector<uint8_t>(kMiB));
  Reload(&record, dst, 3);
  EXPECT_EQ(Read(dst, kMiB), bytes);
}

// One executor per visible GPU, in device order, each with its own UUID and its share of the
// host tier.
TEST(CudaExecutors, OnePerVisibleGpuEachWithItsShareOfTheHostTier) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_DEVICES", "2"}});
  DaemonConfig config;
  config.page_bytes = kPage;
  config.pool_bytes = 2 * kMiB;
  config.host_tier_bytes = 4 * kMiB;
  std::vector<std::string> uuids;
  auto created = CreateCudaExecutors(config, d, &uuids);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ASSERT_EQ(created->size(), 2u);
  ASSERT_EQ(uuids.size(), 2u);
  EXPECT_NE(uuids[0], uuids[1]);
  EXPECT_EQ(uuids[0].size(), 16u);
  for (const auto& e : *created) {
    EXPECT_EQ(e->device_tier()->pages(), 32u);
    ASSERT_NE(e->host_tier(), nullptr);
    EXPECT_EQ(e->host_tier()->pages(), 32u);  // 4 MiB split over two GPUs
  }
  EXPECT_EQ((*created)[1]->device_tier()->pool(), 1);
}

}  // namespace
}  // namespace stash::daemon

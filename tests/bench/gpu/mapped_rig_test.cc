// bench/gpu/mapped_rig.h on the driver stand-in (tests/cuda_standin: TEST AID, NEVER A BACKEND),
// which runs the mapped kernels as their host twins: the set-up that stash-bench-gpu's
// mapped-overlap and peer subcommands time on a GPU (the check's steps 5 and 6) is known to run
// before a GPU ever sees it. Checked: the chunks land in the tier the benchmarks say (device, or
// peer for a pool on another GPU), a round trip brings the bytes back, EndStep reports the flags
// the benchmarks verify with (none on the device tier, a spill on the peer tier, an overflow when
// the pool is full), the tier's mapping is one contiguous range the baselines copy through, and a
// GPU without peer access is a FAILED_PRECONDITION (the peer benchmark's "skipped").
#include "bench/gpu/mapped_rig.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_vmm.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/mapped_paging.h"
#include "tests/vmm_standin.h"

namespace stash::bench_gpu {
namespace {

using stash::testing::Standin;

constexpr uint64_t kChunk = 2 << 20;  // the stand-in's granularity
constexpr uint64_t kStash = 4 << 20;  // 512 rows of 8 KiB

std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 12));
  return v;
}

// The stand-in with `knobs`, device 0's primary context current, a stream, a source holding a
// pattern and a zeroed destination, the way the benchmarks hold them.
class MappedRigTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::pair<const char*, std::string>>& knobs = {},
             bool buffers = true) {
    d_ = Standin::Reset(knobs);
    auto context = PrimaryContext::Retain(d_, 0);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(*context));
    scope_ = std::make_unique<PrimaryContext::Scope>(*context_);
    ASSERT_TRUE(scope_->status().ok());
    ASSERT_EQ(d_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    if (!buffers) return;
    ASSERT_EQ(d_->MemAlloc(&src_, kStash), CUDA_SUCCESS);
    ASSERT_EQ(d_->MemAlloc(&dst_, kStash), CUDA_SUCCESS);
    ASSERT_EQ(d_->MemcpyHtoD(src_, Pattern(kStash, 5).data(), kStash), CUDA_SUCCESS);
    ASSERT_EQ(d_->MemcpyHtoD(dst_, std::vector<uint8_t>(kStash, 0).data(), kStash), CUDA_SUCCESS);
    // From pageable memory both may land after the calls return; stream_ does not wait for them.
    ASSERT_EQ(d_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
  }
  void TearDown() override {
    rig_.reset();
    if (stream_ != nullptr) (void)d_->StreamDestroy(stream_);
    if (src_ != 0) (void)d_->MemFree(src_);
    if (dst_ != 0) (void)d_->MemFree(dst_);
    scope_.reset();
    context_.reset();
  }
  MappedRigConfig Config(int pool_device) const {
    MappedRigConfig c;
    c.device = 0;
    c.pool_device = pool_device;
    c.pool_bytes = 2 * kStash;
    c.chunk_bytes = kChunk;
    c.max_stash_bytes = kStash;
    return c;
  }
  std::vector<uint8_t> Read(CUdeviceptr at, uint64_t bytes) const {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(d_->MemcpyDtoH(out.data(), at, bytes), CUDA_SUCCESS);
    return out;
  }
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address
  const void* src() const { return reinterpret_cast<const void*>(src_); }
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address
  void* dst() const { return reinterpret_cast<void*>(dst_); }

  const CudaDriver* d_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  std::unique_ptr<PrimaryContext::Scope> scope_;
  CUstream stream_ = nullptr;
  CUdeviceptr src_ = 0, dst_ = 0;
  std::unique_ptr<MappedRig> rig_;
};

TEST_F(MappedRigTest, APoolOnTheRanksGpuIsTheDeviceTierAndARoundTripRaisesNoFlag) {
  Start();
  auto rig = MappedRig::Create(d_, Config(0), stream_);
  ASSERT_TRUE(rig.ok()) << rig.status().ToString();
  rig_ = std::move(*rig);
  EXPECT_EQ(rig_->tier(), kernels::kLeaseDevice);
  EXPECT_EQ(rig_->chunk_bytes(), kChunk);
  EXPECT_EQ(rig_->chunks(), 2 * kStash / kChunk);
  EXPECT_EQ(rig_->tier_bytes(), 2 * kStash);
  EXPECT_EQ(rig_->EndStep(), 0u);
  rig_->EnqueueRound(src(), dst(), kStash);
  EXPECT_EQ(rig_->EndStep(), 0u);  // placed in the device tier: no spill, no overflow
  EXPECT_EQ(Read(dst_, kStash), Pattern(kStash, 5));
  // Rounds after rounds (the benchmarks' loop): the pages come back every time.
  for (int i = 0; i < 5; ++i) rig_->EnqueueRound(src(), dst(), kStash);
  EXPECT_EQ(rig_->EndStep(), 0u);
}

TEST_F(MappedRigTest, APoolOnAnotherGpuIsThePeerTierAndItsStashesCountAsSpills) {
  Start();
  auto rig = MappedRig::Create(d_, Config(1), stream_);
  ASSERT_TRUE(rig.ok()) << rig.status().ToString();
  rig_ = std::move(*rig);
  EXPECT_EQ(rig_->tier(), kernels::kLeasePeer);
  EXPECT_EQ(rig_->pool_uuid(), *GpuUuid(d_, 1));
  (void)rig_->EndStep();
  rig_->EnqueueRound(src(), dst(), kStash);
  EXPECT_EQ(rig_->EndStep(), kernels::kStepSpilled);  // what the peer benchmark verifies
  EXPECT_EQ(Read(dst_, kStash), Pattern(kStash, 5));
}

TEST_F(MappedRigTest, TheTiersMappingIsOneRangeThatDeviceZeroReachesWhole) {
  Start();
  auto rig = MappedRig::Create(d_, Config(1), stream_);
  ASSERT_TRUE(rig.ok()) << rig.status().ToString();
  rig_ = std::move(*rig);
  // The peer benchmark's SM-copy baseline writes and reads the whole range through device 0.
  const auto base = reinterpret_cast<CUdeviceptr>(rig_->tier_base());
  const std::vector<uint8_t> bytes = Pattern(rig_->tier_bytes(), 9);
  ASSERT_EQ(d_->MemcpyHtoD(base, bytes.data(), bytes.size()), CUDA_SUCCESS);
  EXPECT_EQ(Read(base, bytes.size()), bytes);  // cuMemcpyDtoH runs after it on the legacy stream
}

TEST_F(MappedRigTest, AStashThePoolCannotHoldOverflowsAndEndStepSaysSo) {
  Start();
  MappedRigConfig config = Config(0);
  config.pool_bytes = kStash;  // one stash's room
  auto rig = MappedRig::Create(d_, config, stream_);
  ASSERT_TRUE(rig.ok()) << rig.status().ToString();
  rig_ = std::move(*rig);
  (void)rig_->EndStep();
  uint64_t first = 0, second = 0;
  rig_->EnqueueStash(src(), kStash, &first);
  rig_->EnqueueStash(src(), kStash, &second);  // no room left: overflows, copies nothing
  rig_->EnqueueReload(second, dst());
  rig_->EnqueueReload(first, dst());
  EXPECT_NE(rig_->EndStep() & kernels::kStepOverflow, 0u);
  EXPECT_EQ(Read(dst_, kStash), Pattern(kStash, 5));  // the first one's reload
}

TEST_F(MappedRigTest, AGpuWithoutPeerAccessIsAFailedPrecondition) {
  Start({{"STASH_STANDIN_NO_PEER", "1"}});
  auto rig = MappedRig::Create(d_, Config(1), stream_);
  ASSERT_FALSE(rig.ok());
  EXPECT_EQ(rig.status().code(), StatusCode::kFailedPrecondition) << rig.status().ToString();
}

TEST_F(MappedRigTest, AGpuWithoutVmmIsAFailedPrecondition) {
  Start({{"STASH_STANDIN_NO_VMM", "1"}}, false);  // the stand-in's cuMemAlloc is VMM too
  auto rig = MappedRig::Create(d_, Config(0), stream_);
  ASSERT_FALSE(rig.ok());
  EXPECT_EQ(rig.status().code(), StatusCode::kFailedPrecondition) << rig.status().ToString();
}

TEST_F(MappedRigTest, AChunkSizeThatIsNotWholeGranulesIsRefused) {
  Start();
  MappedRigConfig config = Config(0);
  config.chunk_bytes = kChunk + (256 << 10);  // whole pages, not whole 2 MiB granules
  auto rig = MappedRig::Create(d_, config, stream_);
  ASSERT_FALSE(rig.ok());
  EXPECT_EQ(rig.status().code(), StatusCode::kInvalidArgument) << rig.status().ToString();
}

}  // namespace
}  // namespace stash::bench_gpu

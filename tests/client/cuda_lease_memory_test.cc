// CudaLeaseMemory (client/mapped/cuda/cuda_lease_memory.h) on the CUDA driver stand-in
// (tests/cuda_standin), with the daemon's VmmChunkMemory as the exporter: fixed ranges, import and
// map, peer chunks, host chunks, and unmaps deferred past the stream's work and any capture. The
// stand-in runs stream work late (STASH_STANDIN_STREAM_DELAY_US) and faults on memory that is not
// mapped when the work runs, so an unmap that came too early crashes these tests.
#include "client/mapped/cuda/cuda_lease_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/shm.h"
#include "daemon/cuda/vmm_chunk_memory.h"
#include "tests/vmm_standin.h"

namespace stash::client {
namespace {

using daemon::VmmChunkMemory;
using kernels::kLeaseDevice;
using kernels::kLeaseHost;
using kernels::kLeasePeer;
using stash::testing::Child;
using stash::testing::Standin;
using SlotState = CudaLeaseMemory::SlotState;

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kChunk = 4 * kMiB;
constexpr uint64_t kPage = 64 << 10;
constexpr std::array<uint64_t, kernels::kLeaseTiers> kQuota = {3 * kChunk, 2 * kChunk, 2 * kChunk};

uint8_t* At(const CudaLeaseMemory& m, uint32_t tier, uint64_t slot) {
  return m.base(tier) + slot * m.chunk_bytes();
}

// A stream of ordinal 0's primary context, and a gate the stream's work waits behind
// (cuStreamWaitValue64 on a registered host word) until the test opens it.
class StreamRig {
 public:
  explicit StreamRig(const CudaDriver* d) : d_(d) {
    auto context = PrimaryContext::Retain(d, 0);
    EXPECT_TRUE(context.ok());
    context_ = std::move(*context);
    const PrimaryContext::Scope scope(context_);
    EXPECT_EQ(d->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    gate_ = static_cast<uint64_t*>(page);
    EXPECT_EQ(d->MemHostRegister(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
    EXPECT_EQ(d->MemHostGetDevicePointer(&gate_device_, page, 0), CUDA_SUCCESS);
  }
  ~StreamRig() {
    const PrimaryContext::Scope scope(context_);
    d_->StreamSynchronize(stream_);
    d_->StreamDestroy(stream_);
    d_->MemHostUnregister(gate_);
    munmap(gate_, 4096);
  }
  StreamRig(const StreamRig&) = delete;
  StreamRig& operator=(const StreamRig&) = delete;

  CUstream stream() const { return stream_; }
  // Every work enqueued from now on waits until Open.
  void Close() {
    const PrimaryContext::Scope scope(context_);
    EXPECT_EQ(d_->StreamWaitValue64(stream_, gate_device_, ++generation_, CU_STREAM_WAIT_VALUE_GEQ),
              CUDA_SUCCESS);
  }
  void Open() { __atomic_store_n(gate_, generation_, __ATOMIC_SEQ_CST); }
  void Memset(const uint8_t* address, uint8_t value, uint64_t bytes) {
    const PrimaryContext::Scope scope(context_);
    EXPECT_EQ(d_->MemsetD8Async(reinterpret_cast<CUdeviceptr>(address), value, bytes, stream_),
              CUDA_SUCCESS);
  }
  void Synchronize() {
    const PrimaryContext::Scope scope(context_);
    EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  }
  const PrimaryContext& context() const { return context_; }

 private:
  const CudaDriver* d_;
  PrimaryContext context_;
  CUstream stream_ = nullptr;
  uint64_t* gate_ = nullptr;
  CUdeviceptr gate_device_ = 0;
  uint64_t generation_ = 0;
};

// A pool on `device` with chunk `chunk` present, filled with pattern `seed`.
std::unique_ptr<VmmChunkMemory> Pool(const CudaDriver* d, int device, uint64_t chunk,
                                     uint8_t seed) {
  auto pool =
      VmmChunkMemory::Create(d, device, "pool" + std::to_string(device), 4 * kChunk, kChunk, kPage);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  if (!pool.ok()) return nullptr;
  EXPECT_TRUE((*pool)->Ensure(chunk).ok());
  stash::testing::FillPattern((*pool)->base() + chunk * kChunk, kChunk, seed);
  return std::move(*pool);
}

UniqueFd Export(const VmmChunkMemory& pool, uint64_t chunk) {
  auto fd = pool.ExportFd(chunk);
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

std::unique_ptr<CudaLeaseMemory> Lease(const CudaDriver* d) {
  auto lease = CudaLeaseMemory::Create(d, 0, kChunk, kQuota);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
  return lease.ok() ? std::move(*lease) : nullptr;
}

TEST(CudaLeaseMemory, ReservesOneRangePerTierSizedForItsQuota) {
  const CudaDriver* d = Standin::Reset();
  auto lease = CudaLeaseMemory::Create(d, 0, kChunk, {2 * kChunk + 1, kChunk, 0});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const CudaLeaseMemory& m = **lease;
  EXPECT_EQ(m.slots(kLeaseDevice), 3u);  // whole chunks, rounded up
  EXPECT_EQ(m.slots(kLeasePeer), 1u);
  EXPECT_EQ(m.slots(kLeaseHost), 1u);  // at least one
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    EXPECT_NE(m.base(t), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.base(t)) % (2 * kMiB), 0u) << "tier " << t;
    EXPECT_EQ(m.slot_state(t, 0), SlotState::kFree);
  }
  EXPECT_NE(m.base(kLeaseDevice), m.base(kLeasePeer));

  // Chunks that are not whole granularity units cannot be mapped at fixed slots.
  EXPECT_EQ(CudaLeaseMemory::Create(d, 0, 3 * kMiB, kQuota).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CudaLeaseMemory, RefusesAGpuWithoutVmmSoTheRankUsesDaemonCopyMode) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_NO_POSIX_FD", "1"}});
  auto lease = CudaLeaseMemory::Create(d, 0, kChunk, kQuota);
  ASSERT_EQ(lease.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(lease.status().message().find("daemon-copy"), std::string::npos)
      << lease.status().message();
}

TEST(CudaLeaseMemory, MapsAnImportedChunkAtItsSlotForThisGpu) {
  const CudaDriver* d = Standin::Reset();
  auto pool = Pool(d, 0, 2, 7);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  const uint8_t* before = lease->base(kLeaseDevice);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 1, Export(*pool, 2), kChunk, 0).ok());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 1), SlotState::kMapped);
  EXPECT_EQ(lease->base(kLeaseDevice), before);
  uint8_t* slot = At(*lease, kLeaseDevice, 1);
  EXPECT_TRUE(stash::testing::HasPattern(slot, kChunk, 7));
  stash::testing::FillPattern(slot, kChunk, 8);  // one memory: the pool sees it
  EXPECT_TRUE(stash::testing::HasPattern(pool->base() + 2 * kChunk, kChunk, 8));

  // A mapped slot takes no second chunk; a bad slot, size or owner is refused; the slot stays
  // as it was.
  EXPECT_EQ(lease->Map(kLeaseDevice, 1, Export(*pool, 2), kChunk, 0).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(lease->Map(kLeaseDevice, 3, Export(*pool, 2), kChunk, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lease->Map(kLeaseDevice, 0, Export(*pool, 2), kChunk + kMiB, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lease->Map(kLeaseDevice, 0, Export(*pool, 2), kChunk, 1).code(),
            StatusCode::kInvalidArgument);  // the own-device tier holds own-device chunks only
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 0), SlotState::kFree);
  EXPECT_TRUE(stash::testing::HasPattern(slot, kChunk, 8));
}

TEST(CudaLeaseMemory, PeerChunksAreRefusedWhereTheDriverSaysNoPeerAccess) {
  const CudaDriver* d = Standin::Reset({{"STASH_STANDIN_NO_PEER", "1"}});
  auto pool = Pool(d, 1, 0, 4);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  const Status refused = lease->Map(kLeasePeer, 0, Export(*pool, 0), kChunk, 1);
  ASSERT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("cuDeviceCanAccessPeer"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("peer tier is skipped"), std::string::npos) << refused.message();
  EXPECT_EQ(lease->slot_state(kLeasePeer, 0), SlotState::kFree);
}

TEST(CudaLeaseMemory, PeerChunksMapWhereThePeerIsReachable) {
  const CudaDriver* d = Standin::Reset();
  auto pool = Pool(d, 1, 3, 4);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  const Status mapped = lease->Map(kLeasePeer, 1, Export(*pool, 3), kChunk, 1);
  ASSERT_TRUE(mapped.ok()) << mapped.ToString();
  EXPECT_TRUE(stash::testing::HasPattern(At(*lease, kLeasePeer, 1), kChunk, 4));
}

// The chunk stays mapped while work that uses it waits on the stream; Reap unmaps it only once
// that work ran, and the work's bytes landed in the chunk.
TEST(CudaLeaseMemory, UnmapWaitsForTheWorkQueuedOnTheStream) {
  const CudaDriver* d = Standin::Reset();
  auto pool = Pool(d, 0, 1, 2);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  StreamRig rig(d);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 0, Export(*pool, 1), kChunk, 0).ok());
  rig.Close();
  rig.Memset(At(*lease, kLeaseDevice, 0), 0xab, kChunk);
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 0, rig.stream()).ok());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 0), SlotState::kUnmapping);
  EXPECT_EQ(lease->pending_unmaps(), 1u);
  // A slot waiting to be unmapped takes no new chunk.
  EXPECT_EQ(lease->Map(kLeaseDevice, 0, Export(*pool, 1), kChunk, 0).code(),
            StatusCode::kFailedPrecondition);

  auto reaped = lease->Reap();  // the work has not run: the gate is closed
  ASSERT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 0), SlotState::kUnmapping);

  rig.Open();
  rig.Synchronize();
  reaped = lease->Reap();
  ASSERT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  ASSERT_EQ(reaped.freed.size(), 1u);
  EXPECT_TRUE((reaped.freed[0] == CudaLeaseMemory::SlotRef{kLeaseDevice, 0}));
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 0), SlotState::kFree);
  EXPECT_EQ(lease->pending_unmaps(), 0u);
  const uint8_t* chunk = pool->base() + kChunk;
  EXPECT_EQ(chunk[0], 0xab);
  EXPECT_EQ(chunk[kChunk - 1], 0xab);
  // Free again: the slot takes a chunk.
  EXPECT_TRUE(lease->Map(kLeaseDevice, 0, Export(*pool, 1), kChunk, 0).ok());
}

// Unmap on a capturing stream records nothing and unmaps nothing until the capture ended; the
// graph launched after it runs on mapped memory, and only then is the slot unmapped.
TEST(CudaLeaseMemory, UnmapNeverHappensDuringCapture) {
  const CudaDriver* d = Standin::Reset();
  auto pool = Pool(d, 0, 0, 2);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  StreamRig rig(d);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 2, Export(*pool, 0), kChunk, 0).ok());
  const PrimaryContext::Scope scope(rig.context());
  ASSERT_EQ(d->StreamBeginCapture(rig.stream(), CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  rig.Memset(At(*lease, kLeaseDevice, 2), 0xcd, kChunk);
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 2, rig.stream()).ok());
  auto reaped = lease->Reap();
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 2), SlotState::kUnmapping);
  CUgraph graph = nullptr;
  ASSERT_EQ(d->StreamEndCapture(rig.stream(), &graph), CUDA_SUCCESS);

  CUgraphExec exec = nullptr;
  ASSERT_EQ(d->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  rig.Close();
  ASSERT_EQ(d->GraphLaunch(exec, rig.stream()), CUDA_SUCCESS);
  reaped = lease->Reap();  // records the event now, behind the launch
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());  // the gate holds the launch back
  rig.Open();
  rig.Synchronize();
  reaped = lease->Reap();
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_EQ(reaped.freed.size(), 1u);
  EXPECT_EQ(pool->base()[0], 0xcd);
  EXPECT_EQ(pool->base()[kChunk - 1], 0xcd);
  d->GraphExecDestroy(exec);
  d->GraphDestroy(graph);
}

TEST(CudaLeaseMemory, TheDestructorWaitsForPendingUnmaps) {
  const CudaDriver* d = Standin::Reset();
  auto pool = Pool(d, 0, 3, 2);
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  StreamRig rig(d);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 1, Export(*pool, 3), kChunk, 0).ok());
  ASSERT_TRUE(lease->Map(kLeaseDevice, 2, Export(*pool, 3), kChunk, 0).ok());
  rig.Close();
  rig.Memset(At(*lease, kLeaseDevice, 1), 0xef, kChunk);
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 1, rig.stream()).ok());
  // Opens the gate while the destructor waits (if it is already there: the check below holds
  // either way, the delay only makes the wait likely to be exercised).
  std::thread opener([&rig] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rig.Open();
  });
  lease.reset();  // waits for the memset, then unmaps both slots
  opener.join();
  EXPECT_EQ(pool->base()[3 * kChunk], 0xef);
  EXPECT_EQ(pool->base()[4 * kChunk - 1], 0xef);
}

TEST(CudaLeaseMemory, HostChunksAreRegisteredForTheGpuAtLeaseTime) {
  const CudaDriver* d = Standin::Reset();
  auto lease = Lease(d);
  ASSERT_TRUE(lease);
  StreamRig rig(d);
  auto memfd = CreateSealedMemfd("host-chunk", kChunk, false);
  ASSERT_TRUE(memfd.ok());
  void* view = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_SHARED, memfd->get(), 0);
  ASSERT_NE(view, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(view);
  stash::testing::FillPattern(bytes, kChunk, 6);
  UniqueFd dup(fcntl(memfd->get(), F_DUPFD_CLOEXEC, 0));
  ASSERT_TRUE(lease->Map(kLeaseHost, 1, std::move(dup), kChunk, -1).ok());
  uint8_t* slot = At(*lease, kLeaseHost, 1);
  EXPECT_TRUE(stash::testing::HasPattern(slot, kChunk, 6));
  // The GPU reaches it at its host address, as one tier range.
  rig.Memset(slot, 0x11, kChunk);
  ASSERT_TRUE(lease->Unmap(kLeaseHost, 1, rig.stream()).ok());
  rig.Synchronize();
  auto reaped = lease->Reap();
  ASSERT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  ASSERT_EQ(reaped.freed.size(), 1u);
  EXPECT_EQ(bytes[0], 0x11);
  EXPECT_EQ(bytes[kChunk - 1], 0x11);
  // Back to an inaccessible reservation: mapping it again works.
  UniqueFd again(fcntl(memfd->get(), F_DUPFD_CLOEXEC, 0));
  EXPECT_TRUE(lease->Map(kLeaseHost, 1, std::move(again), kChunk, -1).ok());
  munmap(view, kChunk);
}

// Another thread of the trainer, played by a driver table over the stand-in's: it begins a
// capture on `stream` exactly where CudaLeaseMemory cannot see it coming. Every call comes from
// the test's one thread.
struct Race {
  const CudaDriver* real = nullptr;
  CUstream stream = nullptr;
  // A capture begins on `stream` right after the next cuStreamIsCapturing said "none" (between
  // Unmap's check and its record).
  bool begin_after_check = false;
  // A capture begins before the next cuEventRecord on `stream` and ends right after it (both
  // between Unmap's check and its second look).
  bool capture_around_record = false;
  // Events last recorded inside a capture. cuEventQuery and cuEventSynchronize refuse them with
  // CUDA_ERROR_CAPTURED_EVENT ("an event that was last recorded inside a capture sequence",
  // cuThreadExchangeStreamCaptureMode) until they are recorded again; the stand-in forgets the
  // mark when the capture ends, so this table keeps it.
  std::set<CUevent> captured;
  std::vector<CUgraph> graphs;  // of the captures begun here, destroyed by the test
};
Race g_race;

CUresult RacingIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  const CUresult r = g_race.real->StreamIsCapturing(stream, status);
  if (r == CUDA_SUCCESS && stream == g_race.stream && g_race.begin_after_check &&
      *status == CU_STREAM_CAPTURE_STATUS_NONE) {
    g_race.begin_after_check = false;
    EXPECT_EQ(g_race.real->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  }
  return r;
}

CUresult RacingEventRecord(CUevent event, CUstream stream) {
  const bool around = stream == g_race.stream && g_race.capture_around_record;
  if (around) {
    g_race.capture_around_record = false;
    EXPECT_EQ(g_race.real->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  }
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_EQ(g_race.real->StreamIsCapturing(stream, &status), CUDA_SUCCESS);
  const CUresult r = g_race.real->EventRecord(event, stream);
  if (r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    g_race.captured.insert(event);
  } else if (r == CUDA_SUCCESS) {
    g_race.captured.erase(event);
  }
  if (around) {
    CUgraph graph = nullptr;
    EXPECT_EQ(g_race.real->StreamEndCapture(stream, &graph), CUDA_SUCCESS);
    g_race.graphs.push_back(graph);
  }
  return r;
}

CUresult RacingEventQuery(CUevent event) {
  if (g_race.captured.count(event) != 0) return CUDA_ERROR_CAPTURED_EVENT;
  return g_race.real->EventQuery(event);
}

CUresult RacingEventSynchronize(CUevent event) {
  if (g_race.captured.count(event) != 0) return CUDA_ERROR_CAPTURED_EVENT;
  return g_race.real->EventSynchronize(event);
}

CUresult RacingEventDestroy(CUevent event) {
  g_race.captured.erase(event);
  return g_race.real->EventDestroy(event);
}

// The stand-in's table with the racing calls in place, for a race on `stream`.
const CudaDriver* RacingDriver(const CudaDriver* real, CUstream stream) {
  static CudaDriver table;
  table = *real;
  table.StreamIsCapturing = RacingIsCapturing;
  table.EventRecord = RacingEventRecord;
  table.EventQuery = RacingEventQuery;
  table.EventSynchronize = RacingEventSynchronize;
  table.EventDestroy = RacingEventDestroy;
  g_race = Race{};
  g_race.real = real;
  g_race.stream = stream;
  return &table;
}

// Ends the capture the race began on the rig's stream and destroys every graph it made.
void EndRacingCaptures(const CudaDriver* d, StreamRig& rig) {
  const PrimaryContext::Scope scope(rig.context());
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_EQ(d->StreamIsCapturing(rig.stream(), &status), CUDA_SUCCESS);
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
    CUgraph graph = nullptr;
    ASSERT_EQ(d->StreamEndCapture(rig.stream(), &graph), CUDA_SUCCESS);
    g_race.graphs.push_back(graph);
  }
  for (CUgraph graph : g_race.graphs) EXPECT_EQ(d->GraphDestroy(graph), CUDA_SUCCESS);
  g_race.graphs.clear();
}

// A capture begins between Unmap's "not capturing" and its event record, so the record may be
// part of the capture and mark no point in the stream (the stand-in then calls the event
// complete at once; the driver refuses to query it). Unmap sees the capture afterwards, drops
// the event, and Reap records one after the capture: the chunk stays mapped until the work
// queued before the Unmap ran (an early unmap faults when the gate opens).
TEST(CudaLeaseMemory, AnUnmapThatACaptureOvertakesWaitsForTheWorkAfterTheCapture) {
  const CudaDriver* real = Standin::Reset();
  auto pool = Pool(real, 0, 1, 2);
  StreamRig rig(real);
  const CudaDriver* d = RacingDriver(real, rig.stream());
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 0, Export(*pool, 1), kChunk, 0).ok());
  rig.Close();
  rig.Memset(At(*lease, kLeaseDevice, 0), 0x5e, kChunk);
  g_race.begin_after_check = true;
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 0, rig.stream()).ok());
  EXPECT_FALSE(g_race.begin_after_check) << "the race did not happen";
  auto reaped = lease->Reap();  // the stream captures: nothing
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  ASSERT_NO_FATAL_FAILURE(EndRacingCaptures(real, rig));

  reaped = lease->Reap();  // records behind the memset, which the gate holds back
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 0), SlotState::kUnmapping);
  rig.Open();
  rig.Synchronize();
  reaped = lease->Reap();
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_EQ(reaped.freed.size(), 1u);
  EXPECT_EQ(pool->base()[kChunk], 0x5e);
  EXPECT_EQ(pool->base()[2 * kChunk - 1], 0x5e);
}

// A capture begins and ends around Unmap's record: Unmap cannot tell, and keeps an event that
// the driver will never query again (CUDA_ERROR_CAPTURED_EVENT). Reap reports it once, drops
// it, records a fresh one, and the slot is freed once the work ran; it never stays unmapping.
TEST(CudaLeaseMemory, AReapWhoseEventACaptureTookRecordsAFreshOne) {
  const CudaDriver* real = Standin::Reset();
  auto pool = Pool(real, 0, 2, 2);
  StreamRig rig(real);
  const CudaDriver* d = RacingDriver(real, rig.stream());
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 1, Export(*pool, 2), kChunk, 0).ok());
  rig.Close();
  rig.Memset(At(*lease, kLeaseDevice, 1), 0x6f, kChunk);
  g_race.capture_around_record = true;
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 1, rig.stream()).ok());
  ASSERT_FALSE(g_race.capture_around_record) << "the race did not happen";
  ASSERT_EQ(g_race.captured.size(), 1u);
  ASSERT_NO_FATAL_FAILURE(EndRacingCaptures(real, rig));

  auto reaped = lease->Reap();
  EXPECT_EQ(reaped.status.code(), StatusCode::kFailedPrecondition) << reaped.status.ToString();
  EXPECT_NE(reaped.status.message().find("CUDA_ERROR_CAPTURED_EVENT"), std::string::npos)
      << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  reaped = lease->Reap();  // a fresh event, behind the memset the gate holds back
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_TRUE(reaped.freed.empty());
  EXPECT_EQ(lease->slot_state(kLeaseDevice, 1), SlotState::kUnmapping);
  rig.Open();
  rig.Synchronize();
  reaped = lease->Reap();
  EXPECT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_EQ(reaped.freed.size(), 1u);
  EXPECT_EQ(pool->base()[2 * kChunk], 0x6f);
  EXPECT_EQ(pool->base()[3 * kChunk - 1], 0x6f);
}

// The same captured event in the destructor: it cannot be waited for, so the destructor records
// a fresh one and waits for that before it unmaps.
TEST(CudaLeaseMemory, TheDestructorWaitsPastAnEventACaptureTook) {
  const CudaDriver* real = Standin::Reset();
  auto pool = Pool(real, 0, 3, 2);
  StreamRig rig(real);
  const CudaDriver* d = RacingDriver(real, rig.stream());
  auto lease = Lease(d);
  ASSERT_TRUE(pool && lease);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 2, Export(*pool, 3), kChunk, 0).ok());
  rig.Close();
  rig.Memset(At(*lease, kLeaseDevice, 2), 0x7a, kChunk);
  g_race.capture_around_record = true;
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 2, rig.stream()).ok());
  ASSERT_EQ(g_race.captured.size(), 1u);
  ASSERT_NO_FATAL_FAILURE(EndRacingCaptures(real, rig));
  std::thread opener([&rig] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rig.Open();
  });
  lease.reset();  // waits for the memset, then unmaps
  opener.join();
  EXPECT_EQ(pool->base()[3 * kChunk], 0x7a);
  EXPECT_EQ(pool->base()[4 * kChunk - 1], 0x7a);
}

// Whether [at, at + bytes) is wholly PROT_NONE mappings (a reservation), per /proc/self/maps.
bool Reserved(const uint8_t* at, uint64_t bytes) {
  std::ifstream maps("/proc/self/maps");
  const auto begin = reinterpret_cast<uintptr_t>(at);
  const uintptr_t end = begin + bytes;
  uintptr_t covered = begin;
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered || lo > covered || covered >= end) continue;
    if (std::string(perms).substr(0, 3) != "---") return false;
    covered = hi;
  }
  return covered >= end;
}

// A host chunk whose mapping fails (a memfd sealed against writable shared mappings: on kernels
// where the file's own mmap refuses it, the old mapping, our reservation, is gone by then)
// leaves the slot free and reserved: never a hole another mapping could take.
TEST(CudaLeaseMemory, AHostChunkThatFailsToMapLeavesItsSlotReserved) {
  const CudaDriver* d = Standin::Reset();
  auto lease = Lease(d);
  ASSERT_TRUE(lease);
  UniqueFd sealed(memfd_create("sealed-host-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(sealed.valid());
  ASSERT_EQ(ftruncate(sealed.get(), static_cast<off_t>(kChunk)), 0);
  ASSERT_EQ(fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  uint8_t* slot = At(*lease, kLeaseHost, 0);
  ASSERT_TRUE(Reserved(slot, kChunk));
  const Status refused = lease->Map(kLeaseHost, 0, std::move(sealed), kChunk, -1);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(lease->slot_state(kLeaseHost, 0), SlotState::kFree);
  EXPECT_TRUE(Reserved(slot, kChunk));
  // And a good chunk maps there after.
  auto memfd = CreateSealedMemfd("host-chunk", kChunk, false);
  ASSERT_TRUE(memfd.ok());
  EXPECT_TRUE(lease->Map(kLeaseHost, 0, std::move(*memfd), kChunk, -1).ok());
}

// The exporter (a daemon) is SIGKILLed: the rank's mapping keeps the chunk, bytes intact, and
// the memory is freed on the rank's last unmap.
TEST(CudaLeaseMemory, AChunkOutlivesItsExportersSigkill) {
  const CudaDriver* d = Standin::Reset();
  auto exporter = Child::Start([d](int s) {
    auto pool = Pool(d, 0, 1, 9);
    if (pool == nullptr) return 20;
    auto fd = pool->ExportFd(1);
    if (!fd.ok() || !stash::testing::Send(s, "chunk", {fd->get()})) return 21;
    (void)stash::testing::Receive(s);  // until killed
    return 0;
  });
  ASSERT_NE(exporter, nullptr);
  std::vector<UniqueFd> fds;
  ASSERT_EQ(stash::testing::Receive(exporter->socket(), &fds), "chunk");
  ASSERT_EQ(fds.size(), 1u);
  auto lease = Lease(d);
  ASSERT_TRUE(lease);
  ASSERT_TRUE(lease->Map(kLeaseDevice, 0, std::move(fds[0]), kChunk, 0).ok());
  exporter->Kill();
  EXPECT_TRUE(stash::testing::HasPattern(At(*lease, kLeaseDevice, 0), kChunk, 9));
  EXPECT_EQ(Standin::DeviceBytesInUse(0), static_cast<long long>(kChunk));  // ours alone now

  StreamRig rig(d);
  ASSERT_TRUE(lease->Unmap(kLeaseDevice, 0, rig.stream()).ok());
  rig.Synchronize();
  auto reaped = lease->Reap();
  ASSERT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  EXPECT_EQ(reaped.freed.size(), 1u);
  EXPECT_EQ(Standin::DeviceBytesInUse(0), 0);
}

}  // namespace
}  // namespace stash::client

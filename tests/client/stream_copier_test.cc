// StreamCopier (client/mapped/cuda/stream_copier.h), mapped mode's paging on the trainer's stream.
//
// Built twice from this one file. Here (tests/client, every machine) it drives the driver
// stand-in (tests/cuda_standin: TEST AID, NEVER A BACKEND), which runs each launched kernel as
// its host twin (kernels/mapped_paging.h) on a stream worker thread after a delay: what is
// checked is the orchestration (what is launched, in which order, on which stream, with which
// arguments and memory, what is refused during capture, what the host learns and when), byte for
// byte. With STASH_STREAM_COPIER_ON_GPU (tests/gpu, label gpu) the same tests run the library's
// own fatbin on a real GPU through libcuda, and skip without one.
#include "tests/client/stream_copier_fixture.h"

namespace stash::client {
namespace {

TEST_F(StreamCopierTest, StashesFillDevicePeerAndHostChunksThenOverflowAndReloadByteExact) {
  std::mt19937_64 rng(11);
  MakeCopier(1);
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    ASSERT_TRUE(copier_->AddChunk(stream_, t, 0, kChunkBytes).ok());
  }
  // Each stash takes 3/4 of a chunk: device, peer, host, then nothing has room.
  const uint64_t row_bytes = 4096, max_rows = 384;
  const uint64_t bytes = row_bytes * max_rows;
  std::vector<std::vector<uint8_t>> data;
  std::vector<uint64_t> tickets;
  std::vector<CUdeviceptr> sources;
  for (int i = 0; i < 4; ++i) {
    data.push_back(Random(rng, bytes));
    sources.push_back(Alloc(bytes));
    Put(sources.back(), data.back());
    auto ticket = copier_->Stash(stream_, Request(sources.back(), max_rows, max_rows, row_bytes));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    tickets.push_back(*ticket);
  }
  ASSERT_TRUE(copier_->BeginStep(stream_, 7).ok());
  Sync();
  const StreamCopier::StepFlagsReport report = copier_->LastStep();
  EXPECT_EQ(report.step, 7u);
  EXPECT_EQ(report.flags, kernels::kStepOverflow | kernels::kStepSpilled);
  for (int i = 0; i < 4; ++i) {
    const CUdeviceptr dst = Alloc(bytes);
    Put(dst, std::vector<uint8_t>(bytes, 0xEE));
    ASSERT_TRUE(copier_->Reload(stream_, tickets[i], reinterpret_cast<void*>(dst), true).ok());
    Sync();
    // The overflowed stash (the fourth) reloads from the source the rank kept.
    EXPECT_EQ(Difference(Get(dst, bytes), data[i]), "same bytes") << "stash " << i;
  }
  EXPECT_EQ(copier_->live(), 0u);
  EXPECT_EQ(copier_->Reload(stream_, tickets[0], reinterpret_cast<void*>(sources[0]), false).code(),
            StatusCode::kNotFound);

  // A source the caller does not keep: an overflowed stash's reload leaves the destination.
  for (uint32_t i = 0; i < 4; ++i) {
    StreamCopier::StashRequest r = Request(sources[i], max_rows, max_rows, row_bytes);
    r.keep_source = false;
    auto ticket = copier_->Stash(stream_, r);
    ASSERT_TRUE(ticket.ok());
    tickets[i] = *ticket;
  }
  const CUdeviceptr dst = Alloc(bytes);
  Put(dst, std::vector<uint8_t>(bytes, 0xEE));
  ASSERT_TRUE(copier_->Reload(stream_, tickets[3], reinterpret_cast<void*>(dst), true).ok());
  // The step's flags reach the host as the stream runs its stashes, before the step ends.
  Sync();
  const uint64_t step = copier_->CurrentStep().step;
  EXPECT_EQ(copier_->CurrentStep().flags & kernels::kStepOverflow, kernels::kStepOverflow);
  ASSERT_TRUE(copier_->BeginStep(stream_, step + 1).ok());
  Sync();
  EXPECT_EQ(Difference(Get(dst, bytes), std::vector<uint8_t>(bytes, 0xEE)), "same bytes");
  EXPECT_EQ(copier_->LastStep().flags & kernels::kStepOverflow, kernels::kStepOverflow);
  EXPECT_EQ(copier_->CurrentStep().step, step + 1);
  EXPECT_EQ(copier_->CurrentStep().flags, 0u) << "the step kernel clears them";
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(copier_->Release(stream_, tickets[i]).ok());
  Sync();
}

TEST_F(StreamCopierTest, TheControlBlockReachesTheSharedBlockAtEachStepAndTheDaemonsLineComesBack) {
  std::mt19937_64 rng(12);
  MakeCopier(2);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 1, kChunkBytes).ok());
  void* shared_host = nullptr;
  ASSERT_EQ(driver_->MemHostAlloc(&shared_host, sizeof(kernels::SessionControl),
                                  CU_MEMHOSTALLOC_DEVICEMAP),
            CUDA_SUCCESS);
  auto* shared = new (shared_host) kernels::SessionControl{};
  shared->magic = kernels::kControlMagic;
  shared->daemon_flags = kernels::kDaemonDraining;
  CUdeviceptr d_shared = 0;
  ASSERT_EQ(driver_->MemHostGetDevicePointer(&d_shared, shared_host, 0), CUDA_SUCCESS);
  ASSERT_TRUE(copier_
                  ->AttachControl(stream_, reinterpret_cast<kernels::SessionControl*>(d_shared),
                                  static_cast<uint8_t*>(shared_host), sizeof(*shared))
                  .ok());
  const CUdeviceptr src = Alloc(kPageBytes);
  Put(src, Random(rng, kPageBytes));
  ASSERT_TRUE(copier_->Stash(stream_, Request(src, 1, 1, kPageBytes)).ok());
  ASSERT_TRUE(copier_->BeginStep(stream_, 1).ok());
  // Drained since the step: the next stash is not tried.
  ASSERT_TRUE(copier_->Stash(stream_, Request(src, 1, 1, kPageBytes)).ok());
  ASSERT_TRUE(copier_->BeginStep(stream_, 2).ok());
  Sync();
  EXPECT_EQ(shared->magic, kernels::kControlMagic);
  EXPECT_EQ(shared->step, 2u);
  EXPECT_EQ(shared->steps, 2u);
  EXPECT_EQ(shared->stashes, 1u);  // the second was not tried
  EXPECT_EQ(shared->overflows, 0u);
  EXPECT_EQ(shared->tiers[kLeaseDevice].pages_leased, kPagesPerChunk);
  EXPECT_EQ(shared->tiers[kLeaseDevice].pages_used, 1u);
  EXPECT_EQ(copier_->LastStep().flags, 0u);
  (void)driver_->MemFreeHost(shared_host);
}

TEST_F(StreamCopierTest, ACapturedGraphPlansEachReplayWithThatReplaysCount) {
  std::mt19937_64 rng(13);
  MakeCopier(1, /*allow_host=*/false);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const uint64_t row_bytes = 8192, max_rows = 512;  // 4 MiB at most: more than the chunk
  const uint64_t bytes = row_bytes * max_rows;
  const CUdeviceptr src = Alloc(bytes), dst = Alloc(bytes), count = Alloc(sizeof(int64_t));
  StreamCopier::StashRequest request = Request(src, 0, max_rows, row_bytes);
  request.d_count = reinterpret_cast<const int64_t*>(count);

  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto ticket = copier_->Stash(stream_, request);
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  // No lease change inside a capture.
  EXPECT_EQ(copier_->AddChunk(stream_, kLeasePeer, 0, kChunkBytes).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(copier_->Reload(stream_, *ticket, reinterpret_cast<void*>(dst), true).ok());
  ASSERT_TRUE(copier_->BeginStep(stream_, 1).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(driver_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);

  // Each replay reads its own count: fits, fits smaller, overflows (reloaded from the source).
  for (const int64_t rows : {200, 17, 511, 0, 256}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const std::vector<uint8_t> data = Random(rng, bytes);
    Put(src, data);
    Put(dst, std::vector<uint8_t>(bytes, 0xEE));
    Put(count, &rows, sizeof(rows));
    ASSERT_EQ(driver_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
    Sync();
    const std::vector<uint8_t> back = Get(dst, bytes);
    const uint64_t valid = static_cast<uint64_t>(rows) * row_bytes;
    for (uint64_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(back[i], i < valid ? data[i] : 0) << "byte " << i;
    }
    const bool overflowed = valid > kChunkBytes;
    EXPECT_EQ(copier_->LastStep().flags, overflowed ? kernels::kStepOverflow : 0u);
  }
  EXPECT_EQ(driver_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
}

// Lease changes happen between replays, outside capture; a graph captured before them pages
// into the chunks the ring holds when it replays.
TEST_F(StreamCopierTest, AGraphReplayedAfterALeaseChangePagesIntoTheNewChunks) {
  std::mt19937_64 rng(15);
  MakeCopier(2, /*allow_host=*/false);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const uint64_t row_bytes = kPageBytes, max_rows = 2 * kPagesPerChunk;  // up to two chunks
  const uint64_t bytes = row_bytes * max_rows;
  const CUdeviceptr src = Alloc(bytes), dst = Alloc(bytes), count = Alloc(sizeof(int64_t));
  StreamCopier::StashRequest request = Request(src, 0, max_rows, row_bytes);
  request.d_count = reinterpret_cast<const int64_t*>(count);
  request.keep_source = false;  // an overflow leaves the destination: visible below
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto ticket = copier_->Stash(stream_, request);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(copier_->Reload(stream_, *ticket, reinterpret_cast<void*>(dst), false).ok());
  ASSERT_TRUE(copier_->BeginStep(stream_, 1).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(driver_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  const int64_t rows = static_cast<int64_t>(kPagesPerChunk + 3);  // more than one chunk
  Put(count, &rows, sizeof(rows));
  auto replay = [&](uint8_t fill) {
    const std::vector<uint8_t> data = Random(rng, bytes);
    Put(src, data);
    Put(dst, std::vector<uint8_t>(bytes, fill));
    EXPECT_EQ(driver_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
    Sync();
    return std::make_pair(data, Get(dst, bytes));
  };
  // One chunk leased: the stash overflows, the destination is left.
  auto [data1, back1] = replay(0x11);
  EXPECT_EQ(back1, std::vector<uint8_t>(bytes, 0x11));
  EXPECT_EQ(copier_->LastStep().flags, kernels::kStepOverflow);
  // A second chunk between replays: the same graph now places the stash.
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 1, kChunkBytes).ok());
  auto [data2, back2] = replay(0x22);
  const uint64_t valid = static_cast<uint64_t>(rows) * row_bytes;
  EXPECT_TRUE(std::equal(back2.begin(), back2.begin() + valid, data2.begin()));
  EXPECT_EQ(copier_->LastStep().flags, 0u);
  // The chunk leaves again (no stash holds it between replays): overflow again.
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 1, kChunkBytes).ok());
  Sync();
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 1), std::optional<bool>(true));
  auto [data3, back3] = replay(0x33);
  EXPECT_EQ(back3, std::vector<uint8_t>(bytes, 0x33));
  EXPECT_EQ(copier_->LastStep().flags, kernels::kStepOverflow);
  EXPECT_EQ(driver_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(StreamCopierTest, AChunkLeavesTheRingOnlyOnceNoStashHoldsItAndTheHostLearnsItLater) {
  std::mt19937_64 rng(14);
  MakeCopier(2);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 1, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(kPageBytes);
  Put(src, Random(rng, kPageBytes));
  auto ticket = copier_->Stash(stream_, Request(src, 1, 1, kPageBytes));  // slot 0's first page
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 1, kChunkBytes).ok());
  EXPECT_EQ(copier_->RemoveChunk(stream_, kLeaseDevice, 1, kChunkBytes).code(),
            StatusCode::kFailedPrecondition);  // one pending per slot
  Sync();
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 0), std::optional<bool>(false));
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 1), std::optional<bool>(true));
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 1), std::nullopt);  // answered once
  ASSERT_TRUE(copier_->Release(stream_, *ticket).ok());
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  Sync();
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 0), std::optional<bool>(true));
}

// A stash made before a capture and released during it (a tensor freed while PyTorch
// captures) is not released in the graph, which may replay it never or many times: the release
// waits for the next boundary outside capture, and until then the stash holds its page.
TEST_F(StreamCopierTest, AReleaseDuringACaptureOfAStashFromBeforeItWaitsForTheBoundary) {
  std::mt19937_64 rng(16);
  MakeCopier(1);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(kPageBytes);
  Put(src, Random(rng, kPageBytes));
  auto before = copier_->Stash(stream_, Request(src, 1, 1, kPageBytes));
  ASSERT_TRUE(before.ok());

  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_TRUE(copier_->Release(stream_, *before).ok());
  EXPECT_EQ(copier_->Release(stream_, *before).code(), StatusCode::kNotFound) << "released";
  EXPECT_EQ(copier_->Reload(stream_, *before, reinterpret_cast<void*>(src), false).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(copier_->RunDeferredReleases(stream_).status().code(), StatusCode::kFailedPrecondition);
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  EXPECT_EQ(copier_->live(), 1u) << "released at the boundary, not in the graph";
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);  // never replayed
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  Sync();
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 0), std::optional<bool>(false))
      << "the stash still holds its page";

  auto ran = copier_->RunDeferredReleases(stream_);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_EQ(*ran, 1u);
  EXPECT_EQ(copier_->live(), 0u);
  EXPECT_EQ(*copier_->RunDeferredReleases(stream_), 0u);
  EXPECT_EQ(copier_->Release(stream_, *before).code(), StatusCode::kNotFound);
  ASSERT_TRUE(copier_->RemoveChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  Sync();
  EXPECT_EQ(copier_->RemovalDone(kLeaseDevice, 0), std::optional<bool>(true)) << "page back";

  // A job whose boundaries are all captured: the next operation outside capture runs them.
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  auto again = copier_->Stash(stream_, Request(src, 1, 1, kPageBytes));
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_TRUE(copier_->Release(stream_, *again).ok());
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
  auto next = copier_->Stash(stream_, Request(src, 1, 1, kPageBytes));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(copier_->live(), 1u) << "the deferred release ran before the stash";
  EXPECT_EQ(*copier_->RunDeferredReleases(stream_), 0u);
  ASSERT_TRUE(copier_->Release(stream_, *next).ok());
  Sync();
}

// The slots of captured stashes come back only once no graph can replay one: a captured stash
// not yet reloaded or released keeps the call refused.
TEST_F(StreamCopierTest, CapturedSlotsStayWhileACapturedStashIsLive) {
  MakeCopier(1);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(64);
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto ticket = copier_->Stash(stream_, Request(src, 1, 1, 64));
  ASSERT_TRUE(ticket.ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
  const Status refused = copier_->ReleaseCapturedSlots();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("reload or release it"), std::string::npos) << refused.message();
  ASSERT_TRUE(copier_->Release(stream_, *ticket).ok());
  EXPECT_TRUE(copier_->ReleaseCapturedSlots().ok());
  Sync();
}

// Work on another stream is the caller's to order (an event); what the host can check is
// refused before anything is launched.
TEST_F(StreamCopierTest, BadArgumentsAndLeaseChangesOutOfTurnAreRefusedBeforeAnyLaunch) {
  MakeCopier(1);
  const CUdeviceptr src = Alloc(kPageBytes);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  CUstream other = nullptr;
  ASSERT_EQ(driver_->StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  Sync();  // orders the other stream after this one's work
  auto ticket = copier_->Stash(other, Request(src, 1, 1, kPageBytes));
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ASSERT_EQ(driver_->StreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_EQ(copier_->Stash(stream_, Request(src, 1, 1, 0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->Stash(stream_, Request(0, 1, 1, 64)).status().code(),
            StatusCode::kInvalidArgument);
  // More than the whole page-record arena (1024 pages) can never fit.
  const Status huge = copier_->Stash(stream_, Request(src, 2048, 2048, kPageBytes)).status();
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.message().find("record_pages"), std::string::npos) << huge.message();
  EXPECT_EQ(copier_->AddChunk(stream_, 3, 0, kChunkBytes).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->AddChunk(stream_, kLeaseDevice, 1, kChunkBytes).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->AddChunk(stream_, kLeasePeer, 0, 100).code(), StatusCode::kInvalidArgument);
  // A chunk added twice would put its page ids in the ring twice; one never added cannot go.
  EXPECT_EQ(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(copier_->RemoveChunk(stream_, kLeasePeer, 0, kChunkBytes).code(),
            StatusCode::kFailedPrecondition);
  // A reload into a buffer that partly overlaps the kept source.
  const CUdeviceptr two = Alloc(2 * kPageBytes);
  auto kept = copier_->Stash(stream_, Request(two, 1, 1, kPageBytes));
  ASSERT_TRUE(kept.ok());
  const Status overlap =
      copier_->Reload(stream_, *kept, reinterpret_cast<void*>(two + kPageBytes / 2), false);
  EXPECT_EQ(overlap.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(copier_->Reload(stream_, *kept, reinterpret_cast<void*>(two), false).ok());
  ASSERT_TRUE(copier_->Release(stream_, *ticket).ok());
  Sync();
  (void)driver_->StreamDestroy(other);
}

TEST_F(StreamCopierTest,
       ALeaseFoundShortReachesTheHostWithoutAStepAndAnOldBlockIsFreedAfterItsWork) {
  MakeCopier(1, /*allow_host=*/false);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(2 * kChunkBytes);
  EXPECT_EQ(copier_->LeaseShortReports(), 0u);
  auto ticket = copier_->Stash(stream_, Request(src, 2 * kPagesPerChunk, 2 * kPagesPerChunk,
                                                kPageBytes));  // overflows
  ASSERT_TRUE(ticket.ok());
  Sync();
  EXPECT_EQ(copier_->LeaseShortReports(), 1u);  // the host asks the daemon for more

  void* block = nullptr;
  ASSERT_EQ(
      driver_->MemHostAlloc(&block, sizeof(kernels::SessionControl), CU_MEMHOSTALLOC_DEVICEMAP),
      CUDA_SUCCESS);
  new (block) kernels::SessionControl{};
  CUdeviceptr d_block = 0;
  ASSERT_EQ(driver_->MemHostGetDevicePointer(&d_block, block, 0), CUDA_SUCCESS);
  EXPECT_TRUE(copier_->OldControlReleasable());
  ASSERT_TRUE(copier_->BeginStep(stream_, 1).ok());
  ASSERT_TRUE(copier_
                  ->AttachControl(stream_, reinterpret_cast<kernels::SessionControl*>(d_block),
                                  static_cast<uint8_t*>(block), sizeof(kernels::SessionControl))
                  .ok());
  Sync();
  EXPECT_TRUE(copier_->OldControlReleasable());
  ASSERT_TRUE(copier_->BeginStep(stream_, 2).ok());
  Sync();
  EXPECT_EQ(static_cast<kernels::SessionControl*>(block)->overflows, 1u);
  ASSERT_TRUE(copier_->Release(stream_, *ticket).ok());
  Sync();
  (void)driver_->MemFreeHost(block);
}

TEST_F(StreamCopierTest, SlotsOfCapturedStashesComeBackWhenTheCallerSaysItsGraphsAreGone) {
  MakeCopier(1);  // 64 plan slots
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(64), dst = Alloc(64);
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  for (int i = 0; i < 64; ++i) {
    auto ticket = copier_->Stash(stream_, Request(src, 1, 1, 64));
    ASSERT_TRUE(ticket.ok()) << i;
    ASSERT_TRUE(copier_->Reload(stream_, *ticket, reinterpret_cast<void*>(dst), false).ok());
  }
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  EXPECT_EQ(copier_->live(), 0u);
  // The graph may still replay those stashes: their slots stay taken.
  EXPECT_EQ(copier_->Stash(stream_, Request(src, 1, 1, 64)).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
  ASSERT_TRUE(copier_->ReleaseCapturedSlots().ok());
  auto ticket = copier_->Stash(stream_, Request(src, 1, 1, 64));
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ASSERT_TRUE(copier_->Release(stream_, *ticket).ok());
  Sync();
}

// The live-stash table of the shared block (`stashctl sessions --detail`): the host writes a
// stash's tags when it enqueues it, the stash's publish its ticket, bytes and pages; a stash
// that took no page holds no entry, and a reload clears it. The lowest free plan slot (and so
// entry) serves each stash.
TEST_F(StreamCopierTest, EachStashsLiveEntryCarriesItsTagsAndWhatItHoldsUntilItsReload) {
  MakeCopier(1, /*allow_host=*/false);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  void* host = nullptr;
  ASSERT_EQ(driver_->MemHostAlloc(&host, kernels::kControlBlockBytes, CU_MEMHOSTALLOC_DEVICEMAP),
            CUDA_SUCCESS);
  host_allocations_.push_back(host);
  std::memset(host, 0, kernels::kControlBlockBytes);
  CUdeviceptr d_block = 0;
  ASSERT_EQ(driver_->MemHostGetDevicePointer(&d_block, host, 0), CUDA_SUCCESS);
  ASSERT_TRUE(copier_
                  ->AttachControl(stream_, reinterpret_cast<kernels::SessionControl*>(d_block),
                                  static_cast<uint8_t*>(host), kernels::kControlBlockBytes)
                  .ok());
  const auto* table = reinterpret_cast<const kernels::LiveTable*>(static_cast<uint8_t*>(host) +
                                                                  kernels::kLiveTableOffset);
  EXPECT_EQ(table->magic, kernels::kLiveTableMagic);
  auto name_of = [](const kernels::LiveEntry& e) {
    return std::string(reinterpret_cast<const char*>(e.name), e.name_bytes);
  };

  const uint64_t row_bytes = 4096;
  const CUdeviceptr src = Alloc(3 * row_bytes), dst = Alloc(3 * row_bytes);
  StreamCopier::StashRequest r = Request(src, 3, 3, row_bytes);
  r.layer = 7;
  r.microbatch = 2;
  r.name = "fc1_input";
  auto placed = copier_->Stash(stream_, r);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  // A stash larger than the whole lease overflows: its entry keeps ticket 0.
  const uint64_t too_big_rows = 2 * kChunkBytes / row_bytes;
  StreamCopier::StashRequest big =
      Request(Alloc(too_big_rows * row_bytes), too_big_rows, too_big_rows, row_bytes);
  big.layer = 8;
  big.name = "fc2_input";
  const_cast<kernels::LiveEntry&>(table->entries[1]).ticket = 77;  // as a stash before it left it
  auto overflowed = copier_->Stash(stream_, big);
  ASSERT_TRUE(overflowed.ok()) << overflowed.status().ToString();
  Sync();
  // Plan slots are taken from 0 up: the first stash's entry is 0, the second's 1.
  const kernels::LiveEntry& first = table->entries[0];
  EXPECT_EQ(first.ticket, *placed);
  EXPECT_EQ(first.tags, uint64_t{7} | uint64_t{2} << 32);
  EXPECT_EQ(name_of(first), "fc1_input");
  EXPECT_EQ(first.bytes, 3 * row_bytes);
  EXPECT_EQ(first.pages, 1u);
  EXPECT_EQ(first.seq % 2, 0u);
  const kernels::LiveEntry& second = table->entries[1];
  EXPECT_EQ(second.ticket, 0u) << "an overflowed stash holds no pages: no live entry";
  EXPECT_EQ(name_of(second), "fc2_input");

  ASSERT_TRUE(copier_->Release(stream_, *overflowed).ok());
  ASSERT_TRUE(copier_->Reload(stream_, *placed, reinterpret_cast<void*>(dst), false).ok());
  Sync();
  EXPECT_EQ(first.ticket, 0u);
  EXPECT_EQ(first.bytes, 0u);
  EXPECT_EQ(first.pages, 0u);

  // The lowest free slot serves the next stash: its entry, with the new stash's tags.
  r.layer = 9;
  r.name = "attn";
  auto next = copier_->Stash(stream_, r);
  ASSERT_TRUE(next.ok());
  Sync();
  EXPECT_EQ(first.ticket, *next);
  EXPECT_EQ(first.tags, uint64_t{9} | uint64_t{2} << 32);
  EXPECT_EQ(name_of(first), "attn");
  ASSERT_TRUE(copier_->Release(stream_, *next).ok());
  Sync();
  EXPECT_EQ(first.ticket, 0u);
}

TEST_F(StreamCopierTest, LiveStashesAreBoundedAndTheLimitSaysWhatToDo) {
  MakeCopier(1);  // 64 plan slots
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  const CUdeviceptr src = Alloc(64);
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(copier_->Stash(stream_, Request(src, 1, 1, 64)).ok());
  const Status full = copier_->Stash(stream_, Request(src, 1, 1, 64)).status();
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("reload or release"), std::string::npos) << full.message();
  Sync();
}

}  // namespace
}  // namespace stash::client

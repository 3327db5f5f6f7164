// Mapped mode on the cuda backend through the public client API
// (client/mapped/cuda/cuda_mapped_session.h): stashd --backend=cuda leases VMM chunks, the library
// maps them and pages device buffers into them with its kernels on the caller's stream. Runs on the
// CUDA driver stand-in (tests/cuda_standin; ctest puts it first on LD_LIBRARY_PATH as libcuda.so.1
// for this binary and the stashd it starts), which runs each kernel as its host twin: what is
// checked is the whole orchestration, byte for byte. Built again as cuda_mapped_gpu_test (label
// gpu, STASH_MAPPED_ON_GPU) against the real driver for tests/gpu/check.sh, where it skips without
// a device: there the kernels are the GPU's own.
#include "tests/integration/cuda_mapped_fixture.h"

#include <signal.h>
#include <unistd.h>

namespace stash::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Stashes of device buffers go into the leased chunks and come back byte for byte, rows past
// the count zeroed; the daemon sees the chunks leased while the session lives and back after.
TEST_F(CudaMapped, DeviceBuffersRoundTripThroughLeasedChunksOnTheCallersStream) {
  StartDaemon();
  Open(MappedOptions(2 * kChunk));
  EXPECT_EQ(client_->backend(), Backend::kCuda);
  EXPECT_EQ(Gpu().chunks_leased(), 2u);

  const std::vector<uint64_t> rows = {100, 1, 255, 37};
  std::vector<std::vector<uint8_t>> sources;
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i < rows.size(); ++i) {
    sources.push_back(Pattern(256 * kRow, static_cast<uint8_t>(i + 1)));
    auto ticket = client_->Stash(Args(Device(sources[i]), rows[i], 256));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    tickets.push_back(*ticket);
    auto answer = client_->Wait(*ticket);
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    EXPECT_EQ(answer->ticket, *ticket);
  }
  // The sources change after their stashes ran: the reloads must come from the chunks.
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  for (CUdeviceptr p : allocations_) ASSERT_EQ(d_->MemsetD8Async(p, 0xee, 256 * kRow, stream_), 0);
  for (size_t i = rows.size(); i-- > 0;) {
    const CUdeviceptr dst = Device(std::vector<uint8_t>(256 * kRow, 0x55));
    ASSERT_TRUE(client_->Reload(Into(tickets[i], dst)).ok());
    const std::vector<uint8_t> got = Host(dst, 256 * kRow);
    const uint64_t valid = rows[i] * kRow;
    EXPECT_EQ(std::memcmp(got.data(), sources[i].data(), valid), 0) << "stash " << i;
    EXPECT_EQ(std::count(got.begin() + static_cast<long>(valid), got.end(), 0),
              static_cast<long>(256 * kRow - valid))
        << "rows past the count are zeroed";
  }
  EXPECT_FALSE(FlagsThenStep(1).overflow);
  client_.reset();
  EXPECT_EQ(Gpu().chunks_leased(), 0u) << "closing gives every chunk back";
}

// With allow_host_spill, a session leases chunks of its GPU's share of the host tier too: a
// stash past the device lease goes whole into the host chunks (page-locked for the GPU in this
// process at lease time) and comes back byte for byte, with no overflow.
TEST_F(CudaMapped, AStashPastTheDeviceLeaseSpillsIntoLeasedHostChunks) {
  StartDaemon({"--host-tier-bytes=16MiB"});  // 4 chunks for each of the stand-in's 2 GPUs
  Options o = MappedOptions(kChunk);
  o.allow_host_spill = true;
  o.lease.host_bytes = 2 * kChunk;
  Open(o);
  EXPECT_EQ(Gpu().chunks_leased(), 1u);
  EXPECT_EQ(HostShare().chunks_leased(), 2u);

  const uint64_t max_rows = 2 * kChunk / kRow;  // more than the device lease holds
  const std::vector<uint8_t> source = Pattern(max_rows * kRow, 21);
  const CUdeviceptr src = Device(source);
  auto ticket = client_->Stash(Args(src, max_rows - 3, max_rows));
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  // The source changes after the stash ran: the reload must come from the host chunks.
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  ASSERT_EQ(d_->MemsetD8Async(src, 0xee, max_rows * kRow, stream_), CUDA_SUCCESS);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(max_rows * kRow, 0x55));
  ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
  const std::vector<uint8_t> got = Host(dst, max_rows * kRow);
  const uint64_t valid = (max_rows - 3) * kRow;
  EXPECT_EQ(std::memcmp(got.data(), source.data(), valid), 0);
  EXPECT_EQ(std::count(got.begin() + static_cast<long>(valid), got.end(), 0),
            static_cast<long>(3 * kRow));
  EXPECT_FALSE(FlagsThenStep(1).overflow) << "the host chunks took the stash";
  client_.reset();
  EXPECT_EQ(HostShare().chunks_leased(), 0u) << "closing gives them back";
}

// A stash bigger than the lease overflows on the device: with the source kept (the default) the
// reload copies it from there; with keep_source false the destination stays as it was and the
// step is flagged, so a trainer reruns it.
TEST_F(CudaMapped, OverflowReloadsTheKeptSourceOrFlagsTheStep) {
  StartDaemon();
  Open(MappedOptions(kChunk));
  const uint64_t max_rows = 2 * kChunk / kRow;  // two chunks' worth: more than the lease
  const std::vector<uint8_t> source = Pattern(max_rows * kRow, 9);
  const CUdeviceptr src = Device(source);
  auto kept = client_->Stash(Args(src, max_rows, max_rows));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  const CUdeviceptr dst = Device(std::vector<uint8_t>(max_rows * kRow, 0x11));
  ASSERT_TRUE(client_->Reload(Into(*kept, dst)).ok());
  EXPECT_EQ(Host(dst, max_rows * kRow), source) << "the kept source was reloaded";
  EXPECT_TRUE(FlagsThenStep(1).overflow) << "an overflow flags its step";

  StashArgs freed = Args(src, max_rows, max_rows);
  freed.keep_source = false;
  auto lost = client_->Stash(freed);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  const CUdeviceptr untouched = Device(std::vector<uint8_t>(max_rows * kRow, 0x22));
  ASSERT_TRUE(client_->Reload(Into(*lost, untouched)).ok());
  const std::vector<uint8_t> got = Host(untouched, max_rows * kRow);
  EXPECT_EQ(std::count(got.begin(), got.end(), 0x22), static_cast<long>(got.size()));
  EXPECT_TRUE(FlagsThenStep(2).overflow);

  auto fits = client_->Stash(Args(src, 10, 10));
  ASSERT_TRUE(fits.ok());
  ASSERT_TRUE(client_->Release(*fits, stream_).ok());
  EXPECT_FALSE(FlagsThenStep(3).overflow) << "flags are per step";
}

// Stashes and reloads captured in a CUDA graph through the client replay with each replay's
// device count (an overflow included: reloaded from the kept source and flagged), with step
// boundaries between replays, outside capture. A release during the capture of a stash made
// before it is not captured: it runs at the first boundary after. GraphsDestroyed then gives
// the captured stash's slot back.
TEST_F(CudaMapped, ACapturedStashAndReloadReplayWithEachReplaysCount) {
  StartDaemon();
  Open(MappedOptions(kChunk));
  const uint64_t max_rows = 2 * kChunk / kRow;  // more than the lease: the largest count overflows
  const uint64_t bytes = max_rows * kRow;
  const CUdeviceptr src = Device(std::vector<uint8_t>(bytes));
  const CUdeviceptr dst = Device(std::vector<uint8_t>(bytes));
  const CUdeviceptr count = Device(std::vector<uint8_t>(sizeof(int64_t)));
  auto before = client_->Stash(Args(src, 1, 1));
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_TRUE(client_->BeginStep(1, stream_).ok());

  ASSERT_EQ(d_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  StashArgs args = Args(src, 0, max_rows);
  args.count.device_count =
      reinterpret_cast<const void*>(count);  // NOLINT(performance-no-int-to-ptr)
  auto captured = client_->Stash(args);
  ASSERT_TRUE(captured.ok()) << captured.status().ToString();
  ASSERT_TRUE(client_->Reload(Into(*captured, dst)).ok());
  ASSERT_TRUE(client_->Release(*before, stream_).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(d_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);

  uint64_t step = 2;
  uint8_t seed = 1;
  for (const int64_t rows :
       {int64_t{16}, int64_t{0}, static_cast<int64_t>(max_rows), int64_t{300}}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const std::vector<uint8_t> data = Pattern(bytes, seed++);
    ASSERT_EQ(d_->MemcpyHtoD(src, data.data(), bytes), CUDA_SUCCESS);
    const std::vector<uint8_t> stale(bytes, 0xEE);
    ASSERT_EQ(d_->MemcpyHtoD(dst, stale.data(), bytes), CUDA_SUCCESS);
    ASSERT_EQ(d_->MemcpyHtoD(count, &rows, sizeof(rows)), CUDA_SUCCESS);
    ASSERT_EQ(d_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    ASSERT_EQ(d_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
    const std::vector<uint8_t> got = Host(dst, bytes);
    const uint64_t valid = static_cast<uint64_t>(rows) * kRow;
    for (uint64_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(got[i], i < valid ? data[i] : 0) << "byte " << i;
    }
    EXPECT_EQ(FlagsThenStep(step++).overflow, valid > kChunk);
  }
  EXPECT_EQ(client_->Reload(Into(*before, dst)).status().code(), StatusCode::kNotFound)
      << "the release made during the capture ran at the first boundary after it";
  EXPECT_EQ(d_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(d_->GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_TRUE(client_->GraphsDestroyed().ok());
}

// An automatic lease grows when a step finds it short: the chunks come on the lease thread and
// join the ring at the next BeginStep, after which the same stash fits.
TEST_F(CudaMapped, AnAutomaticLeaseGrowsAtTheNextStepWhenAStashFindsItShort) {
  StartDaemon();
  Open(MappedOptions(0));
  const uint64_t first = Gpu().chunks_leased();
  ASSERT_GE(first, 1u);
  const uint64_t max_rows = (first + 1) * kChunk / kRow;  // a chunk more than the lease
  const std::vector<uint8_t> source = Pattern(max_rows * kRow, 3);
  const CUdeviceptr src = Device(source);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(max_rows * kRow));
  bool fitted = false;
  // Every step stashes (a step that stashes nothing is no sample of demand). A daemon slower
  // than BeginStep's bounded wait (a loaded machine) adds its chunks a few boundaries later:
  // steps go on, as a trainer's would, for up to 10 s.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (uint64_t step = 1; !fitted && Clock::now() < deadline; ++step) {
    ASSERT_TRUE(client_->BeginStep(step, stream_).ok());
    auto ticket = client_->Stash(Args(src, max_rows, max_rows));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
    ASSERT_EQ(Host(dst, max_rows * kRow), source);
    EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
    fitted = !client_->CurrentStepFlags().overflow;
  }
  EXPECT_TRUE(fitted) << "the lease never grew past " << first << " chunks";
  EXPECT_GT(Gpu().chunks_leased(), first);
}

// An automatic lease follows the steps' demand both ways: it grows while steps stash three
// chunks' worth, and once steps stash little the daemon's targets take chunks out of the ring at a
// step boundary (none of their pages is held), and they are unmapped after the stream's work and
// given back.
TEST_F(CudaMapped, AnAutomaticLeaseShrinksAtStepBoundariesOnceStepsStashLess) {
  StartDaemon();
  Open(MappedOptions(0));
  const uint64_t big_rows = 3 * kChunk / kRow;
  const std::vector<uint8_t> source = Pattern(big_rows * kRow, 5);
  const CUdeviceptr src = Device(source);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(big_rows * kRow));
  uint64_t step = 0;
  for (int i = 0; i < 20 && Gpu().chunks_leased() < 3; ++i) {
    ASSERT_TRUE(client_->BeginStep(++step, stream_).ok());
    auto ticket = client_->Stash(Args(src, big_rows, big_rows));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
    ASSERT_EQ(Host(dst, big_rows * kRow), source);
  }
  const uint64_t grown = Gpu().chunks_leased();
  ASSERT_GE(grown, 3u);

  for (int i = 0; i < 50 && Gpu().chunks_leased() >= grown; ++i) {
    ASSERT_TRUE(client_->BeginStep(++step, stream_).ok());
    auto ticket = client_->Stash(Args(src, 1, 1));
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE(client_->Reload(Into(*ticket, dst, false)).ok());
    ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  }
  // Given back while this process lives, they stay charged to it until it exits (it may still
  // hold their memory: docs/design.md, "What the daemon must not trust").
  const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
  while (Gpu().chunks_leased() + Gpu().chunks_kept() != grown && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const v1::TierStats after = Gpu();
  EXPECT_LT(after.chunks_leased(), grown) << "the lease never shrank";
  EXPECT_GE(after.chunks_leased(), 1u) << "the step's demand keeps a chunk";
  EXPECT_EQ(after.chunks_leased() + after.chunks_kept(), grown) << after.DebugString();

  // This session's stashes still round-trip over what it kept.
  auto ticket = client_->Stash(Args(src, 16, 16));
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
  const std::vector<uint8_t> got = Host(dst, 16 * kRow);
  EXPECT_EQ(std::memcmp(got.data(), source.data(), 16 * kRow), 0);
}

// The daemon dies mid-step: the chunks stay mapped here, the step's stashes reload byte for
// byte, and later stashes still page into them.
TEST_F(CudaMapped, StashesSurviveTheDaemonsDeathMidStep) {
  StartDaemon();
  Open(MappedOptions(2 * kChunk));
  const std::vector<uint8_t> source = Pattern(64 * kRow, 11);
  const CUdeviceptr src = Device(source);
  auto ticket = client_->Stash(Args(src, 64, 64));
  ASSERT_TRUE(ticket.ok());
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  ASSERT_EQ(kill(daemon_->process().pid(), SIGKILL), 0);
  daemon_->process().Wait(std::chrono::seconds(10));
  const CUdeviceptr dst = Device(std::vector<uint8_t>(64 * kRow));
  ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
  EXPECT_EQ(Host(dst, 64 * kRow), source);
  ASSERT_TRUE(client_->BeginStep(1, stream_).ok()) << "a step boundary without a daemon";
  auto again = client_->Stash(Args(src, 64, 64));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(client_->Reload(Into(*again, dst)).ok());
  EXPECT_EQ(Host(dst, 64 * kRow), source);
  EXPECT_FALSE(FlagsThenStep(2).overflow);
  EXPECT_EQ(client_->Stats().status().code(), StatusCode::kUnavailable);
}

// A restarted daemon: the first step boundary with no stash live opens a new session; the old
// chunks leave the rings and are unmapped, the new daemon's take their place at the same
// addresses, and stashes page into them byte for byte.
TEST_F(CudaMapped, TheNextStepWithNoStashLiveLeasesFromARestartedDaemon) {
  const std::string socket = "--socket=" + registry_.path() + "/stashd.sock";
  StartDaemon({socket});
  Open(MappedOptions(2 * kChunk));
  const std::string first_session = client_->session_id();
  const std::vector<uint8_t> source = Pattern(64 * kRow, 13);
  const CUdeviceptr src = Device(source);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(64 * kRow));
  auto held = client_->Stash(Args(src, 64, 64));
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  ASSERT_EQ(kill(daemon_->process().pid(), SIGKILL), 0);
  daemon_->process().Wait(std::chrono::seconds(10));
  daemon_.reset();
  StartDaemon({socket});
  // A stash is live: the step goes on with the old chunks.
  ASSERT_TRUE(client_->BeginStep(1, stream_).ok());
  EXPECT_EQ(client_->session_id(), first_session);
  ASSERT_TRUE(client_->Reload(Into(*held, dst)).ok());
  EXPECT_EQ(Host(dst, 64 * kRow), source) << "a stash made before the restart";
  // None live: a new session (the lease thread's backoff may cost a boundary or two).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (uint64_t step = 2; client_->session_id() == first_session && Clock::now() < deadline;
       ++step) {
    ASSERT_TRUE(client_->BeginStep(step, stream_).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(client_->session_id(), first_session) << "no new session within 10 s";
  ASSERT_TRUE(client_->BeginStep(100, stream_).ok());
  EXPECT_EQ(Gpu().chunks_leased(), 2u) << "the fixed lease, from the new daemon";
  auto again = client_->Stash(Args(src, 64, 64));
  ASSERT_TRUE(again.ok());
  const CUdeviceptr dst2 = Device(std::vector<uint8_t>(64 * kRow, 0x5A));
  ASSERT_TRUE(client_->Reload(Into(*again, dst2)).ok());
  EXPECT_EQ(Host(dst2, 64 * kRow), source) << "paged through the new session's chunks";
  EXPECT_FALSE(FlagsThenStep(101).overflow);
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_GE(stats->stashes, 1u);
  client_.reset();
  EXPECT_EQ(Gpu().chunks_leased(), 0u) << "given back at close";
}

// While the daemon drains, a stash is answered OVERFLOW by the library without enqueueing
// anything: the caller keeps its buffer (even one it meant to free) and the step is not flagged,
// so nothing reruns; earlier stashes reload. The first boundary with nothing live gives the
// chunks back and ends the session; after undrain the next BeginStep opens a new one and
// stashes page again.
TEST_F(CudaMapped, WhileTheDaemonDrainsTheCallerKeepsItsBuffersWithoutARerun) {
  StartDaemon();
  Open(MappedOptions(2 * kChunk));
  const std::vector<uint8_t> source = Pattern(64 * kRow, 17);
  const CUdeviceptr src = Device(source);
  auto held = client_->Stash(Args(src, 64, 64));
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  ASSERT_TRUE(DrainDaemon(daemon_->socket(), /*undrain=*/false));
  StashArgs freed = Args(src, 64, 64);
  freed.keep_source = false;
  auto kept = client_->Stash(freed);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  auto answer = client_->Wait(*kept);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->tier, Tier::kOverflow) << "the caller keeps its buffer";
  const CUdeviceptr dst = Device(std::vector<uint8_t>(64 * kRow));
  ASSERT_TRUE(client_->Reload(Into(*held, dst)).ok());
  EXPECT_EQ(Host(dst, 64 * kRow), source) << "a stash from before the drain";
  const std::string first = client_->session_id();
  // Nothing live at this boundary: the chunks go back and the session ends (as the host twin).
  EXPECT_FALSE(FlagsThenStep(1).overflow) << "nothing was lost: no rerun";
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (DaemonStats(daemon_->socket()).sessions_size() != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(DaemonStats(daemon_->socket()).sessions_size(), 0) << "the drained session ended";
  EXPECT_EQ(Gpu().chunks_leased(), 0u) << "its chunks went back";
  const auto stats = client_->Stats();
  EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stats.status().message().find("drained"), std::string::npos)
      << stats.status().message();
  auto still = client_->Stash(freed);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(client_->Wait(*still)->tier, Tier::kOverflow) << "kept while no session is open";

  EXPECT_FALSE(DrainDaemon(daemon_->socket(), /*undrain=*/true));
  // The next BeginStep opens a new session and its chunks join the same ranges.
  ASSERT_TRUE(client_->BeginStep(2, stream_).ok());
  EXPECT_NE(client_->session_id(), first);
  auto paged = client_->Stash(freed);
  ASSERT_TRUE(paged.ok());
  EXPECT_NE(client_->Wait(*paged)->tier, Tier::kOverflow);
  const CUdeviceptr dst2 = Device(std::vector<uint8_t>(64 * kRow));
  ASSERT_TRUE(client_->Reload(Into(*paged, dst2)).ok());
  EXPECT_EQ(Host(dst2, 64 * kRow), source);
  EXPECT_FALSE(FlagsThenStep(3).overflow);
  EXPECT_TRUE(client_->Stats().ok());
  EXPECT_EQ(DaemonStats(daemon_->socket()).sessions_size(), 1);
}

// `stashctl sessions --detail` shows a GPU rank's live stashes by (layer, microbatch, name), as
// for host ranks: the library writes a stash's tags when it enqueues it and the stash's kernels
// its ticket, bytes and pages; the daemon clamps them to the counters the last step boundary
// published, so the test reads them right after a boundary.
TEST_F(CudaMapped, SessionsShowAGpuRanksLiveStashesByTag) {
  StartDaemon();
  Open(MappedOptions(2 * kChunk));
  const CUdeviceptr src = Device(Pattern(256 * kRow, 3));
  auto tagged = [&](uint32_t layer, uint32_t microbatch, const std::string& name, uint64_t rows) {
    StashArgs a = Args(src, rows, 256);
    a.layer = layer;
    a.microbatch = microbatch;
    a.name = name;
    auto ticket = client_->Stash(a);
    EXPECT_TRUE(ticket.ok()) << ticket.status().ToString();
    return ticket.ok() ? *ticket : 0;
  };
  tagged(1, 0, "fc1", 100);
  tagged(1, 0, "fc1", 10);
  const uint64_t experts = tagged(2, 1, "experts", 256);
  EXPECT_FALSE(FlagsThenStep(1).overflow);
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);  // the boundary published
  v1::GetStatsResponse stats = DaemonStats(daemon_->socket());
  ASSERT_EQ(stats.sessions_size(), 1);
  v1::SessionStats s = stats.sessions(0);
  EXPECT_EQ(s.stashes_live(), 3u);
  EXPECT_EQ(s.live_untagged(), 0u);
  ASSERT_EQ(s.live_size(), 2) << s.DebugString();
  EXPECT_EQ(s.live(0).layer(), 1u);
  EXPECT_EQ(s.live(0).name(), "fc1");
  EXPECT_EQ(s.live(0).stashes(), 2u);
  EXPECT_EQ(s.live(0).bytes(), 110 * kRow);
  EXPECT_EQ(s.live(0).pages(), 8u);  // 7 + 1 pages of 64 KiB
  EXPECT_EQ(s.live(1).layer(), 2u);
  EXPECT_EQ(s.live(1).microbatch(), 1u);
  EXPECT_EQ(s.live(1).name(), "experts");
  EXPECT_EQ(s.live(1).bytes(), 256 * kRow);

  // Reloaded: its row goes (and the boundary's counters agree).
  const CUdeviceptr dst = Device(std::vector<uint8_t>(256 * kRow, 0));
  ASSERT_TRUE(client_->Reload(Into(experts, dst)).ok());
  EXPECT_FALSE(FlagsThenStep(2).overflow);
  ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  s = DaemonStats(daemon_->socket()).sessions(0);
  EXPECT_EQ(s.stashes_live(), 2u);
  ASSERT_EQ(s.live_size(), 1) << s.DebugString();
  EXPECT_EQ(s.live(0).name(), "fc1");
}

// What this mode cannot take is refused with what to change, and nothing is enqueued.
TEST_F(CudaMapped, HostBuffersAndEventsAreRefusedWithWhatToChange) {
  StartDaemon();
  Open(MappedOptions(kChunk));
  auto host = HostBuffer::Allocate(kRow);
  ASSERT_TRUE(host.ok());
  StashArgs from_host;
  from_host.source = host->get();
  from_host.row_bytes = kRow;
  from_host.max_rows = 1;
  auto refused = client_->Stash(from_host);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("device_source"), std::string::npos)
      << refused.status().message();

  const CUdeviceptr src = Device(Pattern(kRow, 1));
  StashArgs with_event = Args(src, 1, 1);
  with_event.ready = EventPoint{host->get(), 0, 1};
  EXPECT_EQ(client_->Stash(with_event).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Reload(Into(12345, src)).status().code(), StatusCode::kNotFound)
      << "a ticket this session never gave";
  EXPECT_EQ(client_->Wait(777).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace stash::testing

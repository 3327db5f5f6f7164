// stash-bench-gpu peer: mapped mode's peer tier over NVLink (the GPU check's step 6, issue 23).
//
// A rank on GPU D (--device, default 0) leases chunks of another GPU P (--peer-device, default
// D + 1): a VmmChunkMemory pool on P, its chunks exported as POSIX fds and mapped into the peer
// tier of a CudaLeaseMemory of D (only where cuDeviceCanAccessPeer(D, P) says yes), and a
// StreamCopier on D whose only tier is that peer tier (its device tier has no slots). At each
// size (--sizes, default 256,1024 MiB) it times, on one stream of D, GPU time from events behind
// a gate, median of --iters (default 10):
//  - stash: StreamCopier::Stash (plan, copy, publish) from D's memory into P's chunks;
//  - reload: StreamCopier::Reload (pop, publish) back into D's memory;
//  - the plain peer copy through the same mapping: an SM copy kernel on D (16-byte loads and
//    stores) writing the peer tier's range and reading it back, the baseline the ratios use;
//  - cudaMemcpyPeerAsync of the same bytes to and from a cudaMalloc buffer on P (peer access
//    enabled from D), as a copy engine moves them.
// GB/s = payload bytes / time. Each size is verified once: a stash must land in the peer tier
// (the step's flags: spilled, no overflow) and the reloaded buffer must equal the source.
// With one visible GPU, or where D cannot access P, it reports `skipped` with the reason.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"
#include "bench/gpu/mapped_rig.h"
#include "common/cuda_driver.h"
#include "stash/kernels/lease_control.h"

namespace stash::bench_gpu {
namespace {

constexpr int kDefaultIters = 10;
const std::vector<int64_t> kDefaultSizesMib{256, 1024};

// A skipped run: says why, writes {"skipped": true, "reason": ...} and exits 0 (no failure: the
// machine cannot run this step).
int Skip(const Options& options, const std::string& reason) {
  std::printf("stash-bench-gpu peer: skipped: %s\n", reason.c_str());
  WriteJsonFile(options.json_path,
                json::PrettyObject({{"bench", json::Str("peer")},
                                    {"skipped", json::Bool(true)},
                                    {"reason", json::Str(reason)},
                                    {"summary", json::Object({{"skipped", json::Bool(true)},
                                                              {"reason", json::Str(reason)}})},
                                    {"ok", json::Bool(true)}}));
  return 0;
}

void* DeviceAlloc(int device, uint64_t bytes, int home) {
  BENCH_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes));
  BENCH_CUDA(cudaSetDevice(home));
  return p;
}

double Gbps(uint64_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) / (ms * 1e-3) / 1e9 : std::nan("");
}

struct SizeResult {
  int64_t size_mib = 0;
  uint64_t bytes = 0;
  double stash_us = 0, reload_us = 0;
  double sm_write_us = 0, sm_read_us = 0;
  double memcpy_write_us = 0, memcpy_read_us = 0;
  bool verified = false;
  std::string verify_error;
};

}  // namespace

int RunPeer(const Options& options) {
  int count = 0;
  BENCH_CUDA(cudaGetDeviceCount(&count));
  const int own = options.device;
  const int peer = options.peer_device >= 0 ? options.peer_device : own + 1;
  if (count < 2) {
    return Skip(options,
                "one CUDA device visible: the peer tier needs a second GPU (the check "
                "passes one with STASH_CHECK_PEER_GPU)");
  }
  if (peer >= count || peer == own) {
    return Skip(options, "no peer device " + std::to_string(peer) + " for device " +
                             std::to_string(own) + " (" + std::to_string(count) +
                             " CUDA devices visible)");
  }
  const DeviceInfo device = SelectDevice(own);
  cudaDeviceProp peer_prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&peer_prop, peer));
  std::printf("stash-bench-gpu peer: %s\npeer: %s (device %d)\n", DeviceLine(device).c_str(),
              peer_prop.name, peer);

  auto loaded = CudaDriver::Get();
  if (!loaded.ok()) Die(1, "peer: the CUDA driver API: " + loaded.status().ToString());
  const CudaDriver* driver = *loaded;
  CUdevice own_dev = 0;
  CUdevice peer_dev = 0;
  int can_access = 0;
  const Status asked = [&] {
    STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&own_dev, own));
    STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&peer_dev, peer));
    STASH_CU_RETURN_IF_ERROR(driver, DeviceCanAccessPeer(&can_access, own_dev, peer_dev));
    return Status::Ok();
  }();
  if (!asked.ok()) Die(1, "peer: " + asked.ToString());
  // Informational only (-1 where the runtime does not say).
  int performance_rank = -1;
  if (cudaDeviceGetP2PAttribute(&performance_rank, cudaDevP2PAttrPerformanceRank, own, peer) !=
      cudaSuccess) {
    performance_rank = -1;
    (void)cudaGetLastError();
  }
  if (can_access == 0) {
    return Skip(options, "cuDeviceCanAccessPeer says device " + std::to_string(own) +
                             " cannot access device " + std::to_string(peer) +
                             " (no NVLink or PCIe peer path between them, or peer access is "
                             "disabled): a rank there skips the peer tier");
  }

  const std::vector<int64_t> sizes = options.sizes_given ? options.sizes_mib : kDefaultSizesMib;
  const int iters = options.iters > 0 ? options.iters : kDefaultIters;
  int64_t largest_mib = 0;
  for (const int64_t mib : sizes) largest_mib = std::max(largest_mib, mib);
  const uint64_t largest = static_cast<uint64_t>(largest_mib) * kMiB;

  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MappedRigConfig config;
  config.device = own;
  config.pool_device = peer;
  config.pool_bytes = largest;
  config.max_stash_bytes = largest;
  auto made = MappedRig::Create(driver, config, stream);
  if (!made.ok()) {
    if (made.status().code() == StatusCode::kFailedPrecondition) {
      return Skip(options, "the peer tier cannot be set up: " + made.status().ToString());
    }
    Die(1, "peer: setting up the peer tier: " + made.status().ToString());
  }
  MappedRig& rig = **made;

  auto* src = static_cast<uint8_t*>(DeviceAlloc(own, largest, own));
  auto* dst = static_cast<uint8_t*>(DeviceAlloc(own, largest, own));
  auto* peer_buffer = static_cast<uint8_t*>(DeviceAlloc(peer, largest, own));
  void* mismatches_memory = nullptr;
  BENCH_CUDA(cudaMalloc(&mismatches_memory, sizeof(unsigned long long)));
  auto* mismatches = static_cast<unsigned long long*>(mismatches_memory);
  BENCH_CUDA(LaunchFill(reinterpret_cast<uint64_t*>(src), largest / 8, 6, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  // cudaMemcpyPeerAsync's buffer on P is cudaMalloc memory: D reaches it directly only with
  // peer access enabled (else the runtime may stage the copy). The VMM chunks need none of it:
  // CudaLeaseMemory gave D access to them with cuMemSetAccess.
  bool peer_access = true;
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
  if (enabled != cudaSuccess && enabled != cudaErrorPeerAccessAlreadyEnabled) {
    peer_access = false;
    std::printf(
        "note: cudaDeviceEnablePeerAccess(%d) failed (%s): cudaMemcpyPeerAsync may be "
        "staged\n",
        peer, cudaGetErrorString(enabled));
  }
  (void)cudaGetLastError();  // the already-enabled answer is sticky in the runtime's last error

  std::printf("peer tier: %" PRIu64 " chunks of %" PRIu64
              " MiB on device %d (%s), mapped into device %d's "
              "peer lease range; %" PRIu64
              " KiB pages, 8 KiB rows; P2P performance rank %d; GPU time "
              "behind a gate, median of %d\n\n",
              rig.chunks(), rig.chunk_bytes() / kMiB, peer, rig.pool_uuid().c_str(), own,
              rig.page_bytes() / kKiB, performance_rank, iters);

  Gate gate;
  std::vector<SizeResult> results;
  (void)rig.EndStep();  // a clean step for the flags below
  for (const int64_t mib : sizes) {
    SizeResult r;
    r.size_mib = mib;
    r.bytes = static_cast<uint64_t>(mib) * kMiB;
    const uint64_t bytes = r.bytes;
    // Verify: the stash goes to the peer tier, the reload brings the source back.
    BENCH_CUDA(cudaMemsetAsync(dst, 0, bytes, stream));
    BENCH_CUDA(cudaMemsetAsync(mismatches, 0, sizeof(unsigned long long), stream));
    rig.EnqueueRound(src, dst, bytes);
    const uint64_t flags = rig.EndStep();
    BENCH_CUDA(LaunchCountMismatches(reinterpret_cast<const uint64_t*>(src),
                                     reinterpret_cast<const uint64_t*>(dst), bytes / 8, mismatches,
                                     stream));
    unsigned long long wrong = 0;
    BENCH_CUDA(cudaMemcpyAsync(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    if ((flags & kernels::kStepOverflow) != 0) {
      r.verify_error = "the stash overflowed (the peer tier did not take it)";
    } else if ((flags & kernels::kStepSpilled) == 0) {
      r.verify_error = "the stash did not land in the peer tier (no spill flag)";
    } else if (wrong != 0) {
      r.verify_error = std::to_string(wrong) + " of " + std::to_string(bytes / 8) +
                       " words of the reloaded buffer differ from the source";
    }
    r.verified = r.verify_error.empty();
    if (!r.verified)
      std::printf("VERIFY FAILED at %" PRId64 " MiB: %s\n", mib, r.verify_error.c_str());

    uint64_t ticket = 0;
    const auto paging = TimeGated(gate, stream, iters, 2, [&](int phase) {
      if (phase == 0) {
        rig.EnqueueStash(src, bytes, &ticket);
      } else {
        rig.EnqueueReload(ticket, dst);
      }
    });
    if ((rig.EndStep() & kernels::kStepOverflow) != 0 && r.verified) {
      r.verified = false;
      r.verify_error = "a timed stash overflowed";
    }
    auto* mapped = static_cast<uint8_t*>(rig.tier_base());
    const auto sm = TimeGated(gate, stream, iters, 2, [&](int phase) {
      if (phase == 0) {
        BENCH_CUDA(LaunchVectorCopy(mapped, src, bytes, device.sm_count, stream));
      } else {
        BENCH_CUDA(LaunchVectorCopy(dst, mapped, bytes, device.sm_count, stream));
      }
    });
    const auto memcpy_peer = TimeGated(gate, stream, iters, 2, [&](int phase) {
      if (phase == 0) {
        BENCH_CUDA(cudaMemcpyPeerAsync(peer_buffer, peer, src, own, bytes, stream));
      } else {
        BENCH_CUDA(cudaMemcpyPeerAsync(dst, own, peer_buffer, peer, bytes, stream));
      }
    });
    r.stash_us = Median(paging[0]) * 1e3;
    r.reload_us = Median(paging[1]) * 1e3;
    r.sm_write_us = Median(sm[0]) * 1e3;
    r.sm_read_us = Median(sm[1]) * 1e3;
    r.memcpy_write_us = Median(memcpy_peer[0]) * 1e3;
    r.memcpy_read_us = Median(memcpy_peer[1]) * 1e3;
    results.push_back(r);
  }

  const auto gbps = [](const SizeResult& r, double us) { return Gbps(r.bytes, us * 1e-3); };
  std::printf("%8s | %11s | %11s | %13s | %13s | %13s | %13s\n", "size", "stash GB/s",
              "reload GB/s", "SM write GB/s", "SM read GB/s", "memcpy write", "memcpy read");
  std::printf(
      "---------+-------------+-------------+---------------+---------------+---------------+----"
      "-----------\n");
  bool all_verified = true;
  std::vector<std::string> rows;
  for (const SizeResult& r : results) {
    all_verified = all_verified && r.verified;
    std::printf("%5" PRId64 " MiB | %11.1f | %11.1f | %13.1f | %13.1f | %13.1f | %13.1f%s\n",
                r.size_mib, gbps(r, r.stash_us), gbps(r, r.reload_us), gbps(r, r.sm_write_us),
                gbps(r, r.sm_read_us), gbps(r, r.memcpy_write_us), gbps(r, r.memcpy_read_us),
                r.verified ? "" : "  VERIFY FAILED");
    rows.push_back(json::Object({
        {"size_mib", json::Int(r.size_mib)},
        {"bytes", json::Int(static_cast<int64_t>(r.bytes))},
        {"stash_us", json::Num(r.stash_us)},
        {"stash_gbps", json::Num(gbps(r, r.stash_us))},
        {"reload_us", json::Num(r.reload_us)},
        {"reload_gbps", json::Num(gbps(r, r.reload_us))},
        {"sm_write_gbps", json::Num(gbps(r, r.sm_write_us))},
        {"sm_read_gbps", json::Num(gbps(r, r.sm_read_us))},
        {"memcpy_peer_write_gbps", json::Num(gbps(r, r.memcpy_write_us))},
        {"memcpy_peer_read_gbps", json::Num(gbps(r, r.memcpy_read_us))},
        {"stash_ratio", json::Num(r.stash_us > 0 ? r.sm_write_us / r.stash_us : std::nan(""))},
        {"reload_ratio", json::Num(r.reload_us > 0 ? r.sm_read_us / r.reload_us : std::nan(""))},
        {"verified", json::Bool(r.verified)},
        {"verify_error", r.verify_error.empty() ? json::Null() : json::Str(r.verify_error)},
    }));
  }
  if (gate.timeouts() > 0) {
    std::printf("warning: %d timing batches ran without their gate (they include launch gaps)\n",
                gate.timeouts());
  }
  // The summary quotes the smallest and the largest size (256 MiB and 1 GiB by default).
  const SizeResult* smallest = &results.front();
  const SizeResult* biggest = &results.front();
  for (const SizeResult& r : results) {
    if (r.bytes < smallest->bytes) smallest = &r;
    if (r.bytes > biggest->bytes) biggest = &r;
  }
  const std::string report = json::PrettyObject({
      {"bench", json::Str("peer")},
      {"skipped", json::Bool(false)},
      {"device", DeviceJson(device)},
      {"peer_device", json::Object({{"index", json::Int(peer)},
                                    {"name", json::Str(peer_prop.name)},
                                    {"uuid", json::Str(rig.pool_uuid())}})},
      {"config", json::Object({{"iters", json::Int(iters)},
                               {"page_bytes", json::Int(static_cast<int64_t>(rig.page_bytes()))},
                               {"chunk_bytes", json::Int(static_cast<int64_t>(rig.chunk_bytes()))},
                               {"chunks", json::Int(static_cast<int64_t>(rig.chunks()))},
                               {"row_bytes", json::Int(8 * kKiB)}})},
      {"can_access_peer", json::Bool(true)},
      {"p2p_performance_rank", json::Int(performance_rank)},
      {"peer_access_enabled", json::Bool(peer_access)},
      {"sizes", json::Array(rows)},
      {"gate_timeouts", json::Int(gate.timeouts())},
      {"summary",
       json::Object(
           {{"skipped", json::Bool(false)},
            {"smallest_mib", json::Int(smallest->size_mib)},
            {"largest_mib", json::Int(biggest->size_mib)},
            {"stash_gbps_smallest", json::Num(gbps(*smallest, smallest->stash_us))},
            {"reload_gbps_smallest", json::Num(gbps(*smallest, smallest->reload_us))},
            {"stash_gbps_largest", json::Num(gbps(*biggest, biggest->stash_us))},
            {"reload_gbps_largest", json::Num(gbps(*biggest, biggest->reload_us))},
            {"sm_write_gbps_largest", json::Num(gbps(*biggest, biggest->sm_write_us))},
            {"sm_read_gbps_largest", json::Num(gbps(*biggest, biggest->sm_read_us))},
            {"memcpy_peer_write_gbps_largest", json::Num(gbps(*biggest, biggest->memcpy_write_us))},
            {"memcpy_peer_read_gbps_largest", json::Num(gbps(*biggest, biggest->memcpy_read_us))},
            {"verified", json::Bool(all_verified)}})},
      {"ok", json::Bool(all_verified)},
  });
  WriteJsonFile(options.json_path, report);
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  BENCH_CUDA(cudaSetDevice(peer));
  BENCH_CUDA(cudaFree(peer_buffer));
  BENCH_CUDA(cudaSetDevice(own));
  BENCH_CUDA(cudaFree(mismatches));
  return all_verified ? 0 : 1;
}

}  // namespace stash::bench_gpu

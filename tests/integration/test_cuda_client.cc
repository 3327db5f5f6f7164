// stash-test-cuda-client: a scripted GPU rank for tests that kill one.
//   stash-test-cuda-client SOCKET churn BYTES
// A mapped session on the cuda backend (GPU 0; the group from $STASHD_GROUP and
// $STASHD_GROUP_SECRET, when set) prints "leased" once open, then runs steps for ever on one
// stream: BeginStep, 4 stashes of up to BYTES of a device buffer (random counts), 3 reloads and a
// release, synchronizing after each step ("stepped" after the first), so a kill lands anywhere
// (mid-claim in a plan kernel, mid-release in a publish, mid-lease). Runs on the driver stand-in
// (as libcuda.so.1) or a GPU.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "stash/client.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || std::string(argv[2]) != "churn") {
    std::fprintf(stderr, "usage: stash-test-cuda-client SOCKET churn BYTES\n");
    return 2;
  }
  constexpr uint64_t kRow = 4096;
  const uint64_t rows = std::strtoull(argv[3], nullptr, 10) / kRow;
  if (rows == 0) return Fail("BYTES must be at least one 4096-byte row");
  auto driver = stash::CudaDriver::Get();
  if (!driver.ok()) return Fail(driver.status().ToString());
  const stash::CudaDriver* d = *driver;
  auto context = stash::PrimaryContext::Retain(d, 0);
  if (!context.ok()) return Fail(context.status().ToString());
  if (d->CtxSetCurrent(context->get()) != CUDA_SUCCESS) return Fail("cuCtxSetCurrent");
  CUstream stream = nullptr;
  CUdeviceptr src = 0, dst = 0;
  if (d->StreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      d->MemAlloc(&src, rows * kRow) != CUDA_SUCCESS ||
      d->MemAlloc(&dst, rows * kRow) != CUDA_SUCCESS) {
    return Fail("cannot allocate the stream and buffers");
  }
  stash::Options options;
  options.socket = argv[1];
  options.backend = stash::Backend::kCuda;
  options.mode = stash::Mode::kMapped;
  options.allow_host_spill = false;
  auto client = stash::Client::Open(options);
  if (!client.ok()) return Fail(client.status().ToString());
  std::printf("leased\n");
  std::fflush(stdout);
  uint64_t held = 0;  // the last step's fourth stash, live across the boundary
  for (uint64_t step = 1;; ++step) {
    if (!(*client)->BeginStep(step, stream).ok()) return Fail("BeginStep");
    if (held != 0) {
      if (auto op = (*client)->Release(held, stream); !op.ok()) return Fail(op.status().ToString());
    }
    uint64_t tickets[4] = {};
    for (uint64_t& ticket : tickets) {
      stash::StashArgs args;
      args.device_source = reinterpret_cast<const void*>(src);  // NOLINT(performance-no-int-to-ptr)
      args.row_bytes = kRow;
      args.max_rows = rows;
      args.count.value = 1 + static_cast<uint64_t>(std::rand()) % rows;
      args.stream = stream;
      auto t = (*client)->Stash(args);
      if (!t.ok()) return Fail(t.status().ToString());
      ticket = *t;
    }
    for (int i = 0; i < 3; ++i) {
      stash::ReloadArgs r;
      r.ticket = tickets[i];
      r.device_destination = reinterpret_cast<void*>(dst);  // NOLINT(performance-no-int-to-ptr)
      r.stream = stream;
      if (auto op = (*client)->Reload(r); !op.ok()) return Fail(op.status().ToString());
    }
    held = tickets[3];
    if (d->StreamSynchronize(stream) != CUDA_SUCCESS) return Fail("cuStreamSynchronize");
    if (step == 1) {
      std::printf("stepped\n");  // a whole step ran: its pages were claimed and given back
      std::fflush(stdout);
    }
  }
}

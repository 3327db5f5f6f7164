// The host-side argument checks of daemon-copy's kernel launches (paging_cuda.h): both ways in,
// the runtime launchers (kernels/paging.cu) and the daemon's driver launcher
// (daemon/cuda/paging_kernels.h), check with these before they enqueue anything.
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "stash/kernels/paging.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::kernels {
namespace {

__attribute__((format(printf, 2, 3))) LaunchResult Fail(LaunchStatus status, const char* format,
                                                        ...) {
  LaunchResult result;
  result.status = status;
  va_list args;
  va_start(args, format);
  std::vsnprintf(result.message, sizeof(result.message), format, args);
  va_end(args);
  return result;
}

bool Aligned(const void* pointer, uintptr_t alignment) {
  return (reinterpret_cast<uintptr_t>(pointer) & (alignment - 1)) == 0;
}

// The checks stash and reload share: page and row sizes, the buffer size, the tiers.
LaunchResult CheckGeometryAndTiers(uint64_t max_rows, uint64_t row_bytes, uint64_t page_bytes,
                                   const CudaTier& device, const CudaTier& peer,
                                   const CudaTier& host) {
  if (device.d_ring == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_ring is null");
  if (device.d_base == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_base is null");
  if ((peer.d_ring == nullptr) != (peer.d_base == nullptr)) {
    return Fail(LaunchStatus::kBadTier,
                "peer.d_ring and peer.d_base must both be set (a peer tier) or both be null");
  }
  if ((host.d_ring == nullptr) != (host.d_base == nullptr)) {
    return Fail(LaunchStatus::kBadTier,
                "host.d_ring and host.d_base must both be set (a host tier) or both be null");
  }
  if (page_bytes < kVectorBytes || (page_bytes & (page_bytes - 1)) != 0) {
    return Fail(LaunchStatus::kBadPageBytes, "page_bytes %llu is not a power of two >= 16",
                static_cast<unsigned long long>(page_bytes));
  }
  if (row_bytes == 0) return Fail(LaunchStatus::kBadRowBytes, "row_bytes is 0");
  if (max_rows > UINT64_MAX / row_bytes) {
    return Fail(LaunchStatus::kTooLarge, "max_rows %llu * row_bytes %llu overflows 64 bits",
                static_cast<unsigned long long>(max_rows),
                static_cast<unsigned long long>(row_bytes));
  }
  if (!Aligned(device.d_ring, 16) || !Aligned(peer.d_ring, 16) || !Aligned(host.d_ring, 16)) {
    return Fail(LaunchStatus::kMisaligned, "a PageRing is not 16-byte aligned");
  }
  return LaunchResult{};
}

}  // namespace

const char* LaunchStatusName(LaunchStatus status) {
  switch (status) {
    case LaunchStatus::kOk:
      return "kOk";
    case LaunchStatus::kNullPointer:
      return "kNullPointer";
    case LaunchStatus::kBadPageBytes:
      return "kBadPageBytes";
    case LaunchStatus::kBadRowBytes:
      return "kBadRowBytes";
    case LaunchStatus::kBadTier:
      return "kBadTier";
    case LaunchStatus::kMisaligned:
      return "kMisaligned";
    case LaunchStatus::kTooLarge:
      return "kTooLarge";
    case LaunchStatus::kCudaError:
      return "kCudaError";
    case LaunchStatus::kOverlap:
      return "kOverlap";
  }
  return "unknown";
}

LaunchResult CanImplementStash(const StashLaunch& args) {
  if (args.d_src == nullptr) return Fail(LaunchStatus::kNullPointer, "d_src is null");
  if (args.d_page_record == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_page_record is null");
  }
  if (args.d_plan == nullptr) return Fail(LaunchStatus::kNullPointer, "d_plan is null");
  LaunchResult result = CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes,
                                              args.device, args.peer, args.host);
  if (!result.ok()) return result;
  if (!Aligned(args.d_plan, 16) || !Aligned(args.d_page_record, 8) || !Aligned(args.d_count, 8)) {
    return Fail(LaunchStatus::kMisaligned,
                "d_plan must be 16-byte aligned, d_page_record and d_count 8-byte aligned");
  }
  return result;
}

LaunchResult CanImplementReload(const ReloadLaunch& args) {
  if (args.d_plan == nullptr) return Fail(LaunchStatus::kNullPointer, "d_plan is null");
  if (args.d_page_record == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_page_record is null");
  }
  if (args.zero_tail && args.d_dst == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "zero_tail is set but d_dst is null");
  }
  if (args.d_kept_src != nullptr && args.d_dst == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_kept_src is set but d_dst is null");
  }
  if (args.d_kept_src != nullptr && args.d_kept_src != args.d_dst && args.row_bytes != 0 &&
      args.max_rows <= UINT64_MAX / args.row_bytes) {
    const uint64_t bytes = args.max_rows * args.row_bytes;
    const auto src = reinterpret_cast<uintptr_t>(args.d_kept_src);
    const auto dst = reinterpret_cast<uintptr_t>(args.d_dst);
    if (src < dst + bytes && dst < src + bytes) {
      return Fail(LaunchStatus::kOverlap,
                  "d_kept_src and d_dst overlap without being the same buffer");
    }
  }
  LaunchResult result = CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes,
                                              args.device, args.peer, args.host);
  if (!result.ok()) return result;
  if (!Aligned(args.d_plan, 16) || !Aligned(args.d_page_record, 8)) {
    return Fail(LaunchStatus::kMisaligned,
                "d_plan must be 16-byte aligned and d_page_record 8-byte aligned");
  }
  return result;
}

}  // namespace stash::kernels

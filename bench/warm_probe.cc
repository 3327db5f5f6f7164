#include "bench/warm_probe.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bench/samples.h"
#include "common/shm.h"
#include "common/sys.h"
#include "common/unique_fd.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (include/uapi/asm-generic/mman-common.h)
#endif

namespace stash::bench {

StatusOr<WarmProbe> ProbeFirstCopyIntoWarmedMemory(const uint8_t* src, uint64_t bytes) {
  UniqueFd fd(memfd_create("stash-bench-warm-probe", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create for the warm-memory probe");
  STASH_SYSCALL(ftruncate(fd.get(), static_cast<off_t>(bytes)));
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) return ErrnoStatus("mmap of the warm-memory probe's memfd");
  auto* dst = static_cast<uint8_t*>(mapped);
  // As the daemon's warmer does; before Linux 5.14 (EINVAL) the writes below allocate the pages.
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, madvise(dst, bytes, MADV_POPULATE_WRITE));
  if (rc != 0 && errno != EINVAL) {
    const Status failed = ErrnoStatus("madvise(MADV_POPULATE_WRITE) of the warm-memory probe");
    munmap(dst, bytes);
    return failed;
  }
  WriteEachPage(dst, bytes);
  WarmProbe probe;
  for (double* gbps : {&probe.first_gbps, &probe.second_gbps}) {
    const auto t0 = Clock::now();
    std::memcpy(dst, src, bytes);
    *gbps = static_cast<double>(bytes) / SecondsBetween(t0, Clock::now()) / 1e9;
  }
  const bool same = std::memcmp(dst, src, bytes) == 0;
  munmap(dst, bytes);
  if (!same) return InternalError("the warm-memory probe copied wrong bytes");
  return probe;
}

}  // namespace stash::bench

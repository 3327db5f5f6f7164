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

StatusOr<std::unique_ptr<WarmedMemory>> WarmedMemory::Make(uint64_t bytes) {
  UniqueFd fd(memfd_create("stash-bench-warm-probe", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create for the warm-memory probe");
  STASH_SYSCALL(ftruncate(fd.get(), static_cast<off_t>(bytes)));
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) return ErrnoStatus("mmap of the warm-memory probe's memfd");
  std::unique_ptr<WarmedMemory> memory(new WarmedMemory(static_cast<uint8_t*>(mapped), bytes));
  // As the daemon's warmer does; before Linux 5.14 (EINVAL) the writes below allocate the pages.
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, madvise(mapped, bytes, MADV_POPULATE_WRITE));
  if (rc != 0 && errno != EINVAL) {
    return ErrnoStatus("madvise(MADV_POPULATE_WRITE) of the warm-memory probe");
  }
  WriteEachPage(memory->dst_, bytes);
  return memory;
}

WarmedMemory::~WarmedMemory() { munmap(dst_, bytes_); }

StatusOr<WarmProbe> WarmedMemory::Copy(const uint8_t* src) {
  WarmProbe probe;
  for (double* gbps : {&probe.first_gbps, &probe.second_gbps}) {
    const auto t0 = Clock::now();
    std::memcpy(dst_, src, bytes_);
    *gbps = static_cast<double>(bytes_) / SecondsBetween(t0, Clock::now()) / 1e9;
  }
  if (std::memcmp(dst_, src, bytes_) != 0) {
    return InternalError("the warm-memory probe copied wrong bytes");
  }
  return probe;
}

}  // namespace stash::bench

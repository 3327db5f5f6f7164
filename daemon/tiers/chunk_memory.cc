#include "daemon/tiers/chunk_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/bytes.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/shm.h"
#include "common/sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (include/uapi/asm-generic/mman-common.h)
#endif

namespace stash::daemon {
namespace {

// How much one Populate call covers: a large chunk is populated a slice at a time so that a
// chunk short of memory says so early and the call never holds the mm's lock for long.
constexpr uint64_t kPopulateSlice = 64ULL << 20;

}  // namespace

const char* PageKindName(PageKind kind) {
  switch (kind) {
    case PageKind::kTransparentHuge:
      return "transparent huge pages";
    case PageKind::kHugetlb:
      return "hugetlb 2 MiB pages";
    case PageKind::kSmall:
      break;
  }
  return "4 KiB pages";
}

StatusOr<std::unique_ptr<ChunkMemory>> ChunkMemory::Create(const std::string& label, uint64_t bytes,
                                                           uint64_t chunk_bytes,
                                                           const ChunkMemoryOptions& options) {
  if (bytes == 0 || chunk_bytes == 0) {
    return InvalidArgumentError("chunked memory " + label + " needs bytes and chunk bytes > 0");
  }
  // Huge pages form only where a chunk starts on a huge-page boundary, in memory and in its file.
  if (options.hugetlb && (chunk_bytes % kHugePageBytes != 0 || bytes % kHugePageBytes != 0)) {
    return InvalidArgumentError("hugetlb memory " + label + " needs sizes in whole 2 MiB pages");
  }
  const bool huge = options.transparent_huge && chunk_bytes % kHugePageBytes == 0;
  const uint64_t align = huge || options.hugetlb ? kHugePageBytes : 0;
  const PageKind kind = options.hugetlb ? PageKind::kHugetlb
                        : huge          ? PageKind::kTransparentHuge
                                        : PageKind::kSmall;
  // One reservation: nothing else lands between the chunks, and base() never moves.
  void* addr =
      mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap reserve of " + std::to_string(bytes) + " bytes");
  uint8_t* base = TrimToAlignment(static_cast<uint8_t*>(addr), bytes, align);
  std::unique_ptr<ChunkMemory> memory(
      new ChunkMemory(label, base, bytes, chunk_bytes, options, kind));
  const uint64_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  memory->fds_.resize(chunks);
  memory->warm_ = std::make_unique<std::atomic<bool>[]>(chunks);
  // Locking a large tier takes a while (the kernel zeroes every page): say how far it is.
  const bool progress = options.lock && bytes >= (1ULL << 30);
  const auto start = std::chrono::steady_clock::now();
  uint64_t said = 0;  // tenths said so far
  for (uint64_t c = 0; c < chunks; ++c) {
    STASH_ASSIGN_OR_RETURN(memory->fds_[c], memory->MapFresh(c));
    const uint64_t tenths = (c + 1) * 10 / chunks;
    if (progress && tenths > said) {
      said = tenths;
      Log("pool")->info(
          "{}: locked {} of {} in memory ({} s)", label,
          FormatBytes(std::min(bytes, (c + 1) * chunk_bytes)), FormatBytes(bytes),
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  return memory;
}

ChunkMemory::ChunkMemory(std::string label, uint8_t* base, uint64_t bytes, uint64_t chunk_bytes,
                         const ChunkMemoryOptions& options, PageKind page_kind)
    : label_(std::move(label)),
      base_(base),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      options_(options),
      page_kind_(page_kind) {}

ChunkMemory::~ChunkMemory() { munmap(base_, bytes_); }

uint64_t ChunkMemory::ChunkBytes(uint64_t chunk) const {
  const uint64_t first = chunk * chunk_bytes_;
  return std::min(chunk_bytes_, bytes_ - first);
}

StatusOr<UniqueFd> ChunkMemory::MapFresh(uint64_t chunk) {
  const uint64_t size = ChunkBytes(chunk);
  const std::string name = label_ + "-chunk" + std::to_string(chunk);
  const bool hugetlb = page_kind_ == PageKind::kHugetlb;
  STASH_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(name, size, hugetlb));
  void* want = base_ + chunk * chunk_bytes_;
  // hugetlb: no MAP_NORESERVE, so the huge pages are reserved now (ENOMEM when the pool is
  // short) and a later first touch cannot fault with SIGBUS.
  const int flags = MAP_SHARED | (hugetlb ? 0 : MAP_NORESERVE);
  // First where nothing is at stake: what can fail (the reservation) fails here, leaving the
  // chunk's old memory in place. A shared hugetlb reservation belongs to the file, so the
  // mapping below takes no new one.
  void* trial = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd.get(), 0);
  if (trial == MAP_FAILED) {
    if (hugetlb && errno == ENOMEM) {
      return ResourceExhaustedError(
          "cannot reserve " + FormatBytes(size) + " of huge pages for " + name +
          " (the kernel's huge page pool is short: HugePages_Free in /proc/meminfo): reserve "
          "more (sysctl vm.nr_hugepages) or start with --huge-pages=auto");
    }
    return ErrnoStatus("mmap of " + name);
  }
  munmap(trial, size);
  void* got = mmap(want, size, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd.get(), 0);
  if (got == MAP_FAILED) {
    const Status failed = ErrnoStatus("mmap of " + name + " in place");
    // A kernel before 6.12 may have unmapped the old memory already: keep the range reserved,
    // so no other mapping (another client's buffer) can land where stashes are copied.
    (void)mmap(want, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
               0);
    return failed;
  }
  // Before any page exists: the pages the kernel allocates from here on may be huge.
  if (page_kind_ == PageKind::kTransparentHuge) (void)madvise(want, size, MADV_HUGEPAGE);
  if (options_.lock && mlock(want, size) != 0) {
    const int err = errno;
    return ResourceExhaustedError(
        "cannot lock " + FormatBytes(size) + " of " + name + " in memory (" + std::strerror(err) +
        "): raise the locked-memory limit (LimitMEMLOCK=infinity in the systemd unit, ulimit -l, "
        "the IPC_LOCK capability in Kubernetes), free memory, or start without --lock-memory");
  }
  SetWarm(chunk, options_.lock);  // mlock populated it
  return fd;
}

void ChunkMemory::SetWarm(uint64_t chunk, bool warm) {
  if (warm_[chunk].exchange(warm) == warm) return;
  if (warm) {
    bytes_warm_.fetch_add(ChunkBytes(chunk), std::memory_order_relaxed);
  } else {
    bytes_warm_.fetch_sub(ChunkBytes(chunk), std::memory_order_relaxed);
  }
}

Status ChunkMemory::Renew(uint64_t chunk) {
  STASH_ASSIGN_OR_RETURN(UniqueFd fd, MapFresh(chunk));
  fds_[chunk] = std::move(fd);
  return Status::Ok();
}

StatusOr<PopulateMethod> ChunkMemory::Populate(uint64_t chunk) {
  uint8_t* const start = base_ + chunk * chunk_bytes_;
  const uint64_t size = ChunkBytes(chunk);
  // Each page is also written once (WriteEachPage, common/shm.h), except on hugetlb, where a page a
  // holder punched out of a leased chunk meanwhile would fault with SIGBUS; those pages are
  // reserved at start anyway.
  const bool write_pages = page_kind_ != PageKind::kHugetlb;
  for (uint64_t done = 0; done < size; done += kPopulateSlice) {
    const uint64_t n = std::min(kPopulateSlice, size - done);
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, madvise(start + done, n, MADV_POPULATE_WRITE));
    if (rc == 0) {
      if (write_pages) WriteEachPage(start + done, n);
      continue;
    }
    if (errno == EINVAL && done == 0 && write_pages) {
      // Before Linux 5.14: the write of each page allocates it in the memfd. It changes no
      // byte: a copy may run into this chunk meanwhile.
      WriteEachPage(start, size);
      SetWarm(chunk, true);
      return PopulateMethod::kWriteFault;
    }
    return ResourceExhaustedError(ErrnoStatus("populating " + FormatBytes(size) + " of " + label_ +
                                              "-chunk" + std::to_string(chunk) +
                                              " (madvise MADV_POPULATE_WRITE)")
                                      .message());
  }
  SetWarm(chunk, true);
  return PopulateMethod::kPopulateWrite;
}

}  // namespace stash::daemon

#include "common/shm.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <fstream>

#include "common/macros.h"
#include "common/sys.h"

namespace stash {
namespace {

StatusOr<uint8_t*> MapFd(int fd, uint64_t bytes, int extra_flags) {
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | extra_flags, fd, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap of " + std::to_string(bytes) + " bytes");
  return static_cast<uint8_t*>(addr);
}

StatusOr<UniqueFd> CreateMemfd(const std::string& label, uint64_t bytes, unsigned flags) {
  if (bytes == 0) return InvalidArgumentError("shared memory size must be > 0 bytes");
  UniqueFd fd(memfd_create(label.c_str(), MFD_CLOEXEC | flags));
  if (!fd.valid()) return ErrnoStatus("memfd_create(" + label + ")");
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, ftruncate(fd.get(), static_cast<off_t>(bytes)));
  if (rc != 0) return ErrnoStatus("ftruncate(" + label + ", " + std::to_string(bytes) + ")");
  return fd;
}

std::string SealNames(unsigned seals) {
  std::string out;
  auto add = [&](unsigned bit, const char* name) {
    if ((seals & bit) != 0) out += (out.empty() ? "" : "|") + std::string(name);
  };
  add(F_SEAL_SEAL, "F_SEAL_SEAL");
  add(F_SEAL_SHRINK, "F_SEAL_SHRINK");
  add(F_SEAL_GROW, "F_SEAL_GROW");
  add(F_SEAL_WRITE, "F_SEAL_WRITE");
  add(F_SEAL_FUTURE_WRITE, "F_SEAL_FUTURE_WRITE");
  return out.empty() ? "none" : out;
}

constexpr const char* kHowToAllocate =
    ": hand over memory from HostBuffer::Allocate (a memfd_create(MFD_ALLOW_SEALING) file "
    "sealed with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)";

}  // namespace

uint8_t* TrimToAlignment(uint8_t* mapping, uint64_t bytes, uint64_t align) {
  if (align == 0) return mapping;
  const auto at = reinterpret_cast<uintptr_t>(mapping);
  const uint64_t head = ((at + align - 1) & ~(align - 1)) - at;
  uint8_t* aligned = mapping + head;
  if (head > 0) munmap(mapping, head);
  if (align - head > 0) munmap(aligned + bytes, align - head);
  return aligned;
}

std::string ShmemHugePageSetting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

bool ShmemHugePagesOffered(const std::string& setting) {
  return setting == "always" || setting == "within_size" || setting == "advise" ||
         setting == "force";
}

// Not instrumented for ThreadSanitizer: racing with a copy's plain stores is the point, and
// changes nothing.
__attribute__((no_sanitize("thread"))) void WriteEachPage(uint8_t* start, uint64_t size) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uint64_t off = 0; off < size; off += page) {
    __atomic_fetch_or(reinterpret_cast<uint64_t*>(start + off), uint64_t{0}, __ATOMIC_RELAXED);
  }
}

bool AllocatePages(int fd, uint64_t bytes) {
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, fallocate(fd, 0, 0, static_cast<off_t>(bytes)));
  return rc == 0;
}

Status CheckClientMemoryFd(int fd, uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("the memory's declared size must be > 0 bytes");
  // F_GET_SEALS first: only shmem and hugetlbfs files answer it, and it never calls into a
  // file system, so no other kind of file (a FUSE file, say) gets a request from the daemon.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return InvalidArgumentError("the descriptor is not a memfd that allows sealing" +
                                std::string(kHowToAllocate));
  }
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    // A hugetlbfs memfd can lose its pages under a mapping (a punched hole with no huge page
    // left to fill it faults with SIGBUS).
    return InvalidArgumentError("the memfd is not on shmem (a huge-page memfd?)" +
                                std::string(kHowToAllocate));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return InvalidArgumentError(
        ErrnoStatus("the descriptor cannot be inspected (fstat)").message() + kHowToAllocate);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError("the descriptor is not a memfd (not a regular file)" +
                                std::string(kHowToAllocate));
  }
  const auto have = static_cast<unsigned>(seals);
  if ((have & kClientMemorySeals) != kClientMemorySeals) {
    return InvalidArgumentError("the memfd lacks seals (it has " + SealNames(have) +
                                "; needs F_SEAL_SHRINK, F_SEAL_GROW and "
                                "F_SEAL_SEAL), so it could shrink under the daemon's mapping" +
                                std::string(kHowToAllocate));
  }
  if ((have & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return InvalidArgumentError(
        "the memfd is write-sealed; the daemon writes reloaded rows and done counters into it" +
        std::string(kHowToAllocate));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return InvalidArgumentError("the descriptor is not open for reading and writing" +
                                std::string(kHowToAllocate));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgumentError("the memfd holds " + std::to_string(st.st_size) +
                                " bytes, less than the " + std::to_string(bytes) +
                                " declared: declare the size it was allocated with");
  }
  return Status::Ok();
}

StatusOr<UniqueFd> CreateSealedMemfd(const std::string& label, uint64_t bytes, bool hugetlb) {
  STASH_ASSIGN_OR_RETURN(
      UniqueFd fd, CreateMemfd(label, bytes, MFD_ALLOW_SEALING | (hugetlb ? MFD_HUGETLB : 0)));
  if (fcntl(fd.get(), F_ADD_SEALS, static_cast<int>(kClientMemorySeals)) != 0) {
    return ErrnoStatus("fcntl(F_ADD_SEALS) on " + label);
  }
  return fd;
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::CreateSealed(const std::string& label,
                                                                   uint64_t bytes) {
  STASH_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(label, bytes));
  STASH_ASSIGN_OR_RETURN(uint8_t * data, MapFd(fd.get(), bytes, 0));
  return std::unique_ptr<SharedMemory>(new SharedMemory(std::move(fd), data, bytes));
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::MapClientFd(UniqueFd fd, uint64_t bytes) {
  STASH_RETURN_IF_ERROR(CheckClientMemoryFd(fd.get(), bytes));
  STASH_ASSIGN_OR_RETURN(uint8_t * data, MapFd(fd.get(), bytes, 0));
  return std::unique_ptr<SharedMemory>(new SharedMemory(UniqueFd(), data, bytes));
}

SharedMemory::~SharedMemory() { munmap(data_, size_); }

}  // namespace stash

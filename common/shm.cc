#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/random.h"
#include "common/sys.h"

namespace stash {
namespace {

StatusOr<uint8_t*> MapFd(int fd, uint64_t bytes, int extra_flags) {
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | extra_flags, fd, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap of " + std::to_string(bytes) + " bytes");
  return static_cast<uint8_t*>(addr);
}

}  // namespace

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("shared memory size must be > 0 bytes");
  const std::string name = "/stashd-" + std::to_string(getpid()) + "-" + RandomHex(16);
  int fd = -1;
  STASH_SYSCALL_RETRY(fd, shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  if (fd < 0) return ErrnoStatus("shm_open(" + name + ")");
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, ftruncate(fd, static_cast<off_t>(bytes)));
  if (rc != 0) {
    Status status = ErrnoStatus("ftruncate(" + name + ", " + std::to_string(bytes) + ")");
    close(fd);
    shm_unlink(name.c_str());
    return status;
  }
  auto mapped = MapFd(fd, bytes, 0);
  close(fd);
  if (!mapped.ok()) {
    shm_unlink(name.c_str());
    return mapped.status();
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, *mapped, bytes, true));
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name,
                                                           uint64_t bytes) {
  if (name.rfind("/stashd-", 0) != 0 || name.find('/', 1) != std::string::npos ||
      name.size() > 200) {
    return InvalidArgumentError("'" + name +
                                "' is not a stashd shared-memory name (expected /stashd-...)");
  }
  if (bytes == 0) return InvalidArgumentError("shared memory size must be > 0 bytes");
  int fd = -1;
  STASH_SYSCALL_RETRY(fd, shm_open(name.c_str(), O_RDWR, 0));
  if (fd < 0) return ErrnoStatus("shm_open(" + name + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status status = ErrnoStatus("fstat(" + name + ")");
    close(fd);
    return status;
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return FailedPreconditionError("shared memory " + name + " has " + std::to_string(st.st_size) +
                                   " bytes, less than the " + std::to_string(bytes) +
                                   " registered");
  }
  auto mapped = MapFd(fd, bytes, 0);
  close(fd);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, *mapped, bytes, false));
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::CreateAnonymous(const std::string& label,
                                                                      uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("region size must be > 0 bytes");
  int fd = memfd_create(label.c_str(), MFD_CLOEXEC);
  if (fd < 0) return ErrnoStatus("memfd_create(" + label + ")");
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, ftruncate(fd, static_cast<off_t>(bytes)));
  if (rc != 0) {
    Status status = ErrnoStatus("ftruncate(" + label + ", " + std::to_string(bytes) + ")");
    close(fd);
    return status;
  }
  auto mapped = MapFd(fd, bytes, MAP_NORESERVE);
  close(fd);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory("", *mapped, bytes, false));
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  Unlink();
}

void SharedMemory::ForceUnlink() {
  if (!name_.empty()) shm_unlink(name_.c_str());
  owner_ = false;
}

void SharedMemory::Unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

}  // namespace stash

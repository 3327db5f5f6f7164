// TEST AID, NEVER A BACKEND (see standin.h): the stand-in's virtual memory management on host
// memory, and the per-device VRAM budget shared by every process of a registry.
//
// Physical memory. Each allocation (cuMemCreate) is a file `alloc-d<device>-<pid>-<n>` in the
// registry folder (STASH_STANDIN_REGISTRY), sized to the allocation. Every reference to it holds
// its own open file description with an OFD read lock (fcntl F_OFD_SETLK) on byte 0: each
// generic handle, each mapping, and each exported file descriptor (so a descriptor in flight in
// a socket, or held by a process that has not imported it yet, keeps the memory alive, as the
// driver documents for shareable handles). The kernel drops a description's lock when its last
// descriptor closes, also when a process dies, so a SIGKILLed holder frees its references the way
// the driver does. An allocation is alive while any of its locks is held: cuMemCreate and
// cuMemGetInfo probe each file with F_OFD_GETLK (a write-lock probe, which every read lock
// conflicts with), sum the live sizes per device, and delete dead files, all under a registry-
// wide lock. Nothing can revive a dead allocation: new references are only ever opened from
// descriptors that hold a lock.
//
// Virtual memory. cuMemAddressReserve is an anonymous PROT_NONE reservation; cuMemMap maps the
// allocation's file MAP_SHARED|MAP_FIXED with PROT_NONE into it; cuMemSetAccess makes it readable
// and writable; cuMemUnmap puts an anonymous PROT_NONE reservation back. Every access the driver
// would fault on faults here with SIGSEGV. Freed reservations stay PROT_NONE (never unmapped) so
// late work touching them faults instead of landing in memory malloc reused.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "internal.h"
#include "standin.h"

namespace standin {
namespace {

struct Handle {
  int fd = -1;  // its own open file description, read-locked
  size_t size = 0;
  int device = 0;
  bool exportable = false;  // requestedHandleTypes had CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
};

struct Mapping {
  size_t size = 0;
  int fd = -1;  // its own open file description, read-locked: the mapping's reference
  int device = 0;
  int prot = PROT_NONE;
};

std::mutex g_mu;  // everything below, and the registry's in-process side

std::map<CUmemGenericAllocationHandle, Handle>& Handles() {
  static auto* handles = new std::map<CUmemGenericAllocationHandle, Handle>();
  return *handles;
}
std::map<uintptr_t, size_t>& Reservations() {
  static auto* reservations = new std::map<uintptr_t, size_t>();
  return *reservations;
}
std::map<uintptr_t, Mapping>& Mappings() {
  static auto* mappings = new std::map<uintptr_t, Mapping>();
  return *mappings;
}
std::map<uintptr_t, size_t>& HostRanges() {
  static auto* ranges = new std::map<uintptr_t, size_t>();
  return *ranges;
}

CUmemGenericAllocationHandle g_next_handle = 0x57a5000001ULL;
std::atomic<uint64_t> g_next_file{0};

std::string Errno() { return std::strerror(errno); }

// A read lock on byte 0 through `fd`'s open file description.
bool LockShared(int fd) {
  struct flock lock {};
  lock.l_type = F_RDLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

// A new open file description of the file behind `fd`, read-locked: a new reference.
int NewReference(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int ref = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (ref < 0) return -1;
  if (!LockShared(ref)) {
    close(ref);
    return -1;
  }
  return ref;
}

// Holds the registry-wide lock: an OFD write lock through a description of its own (so a forked
// child's acquisitions exclude the parent's) plus g_mu, which the caller holds.
class RegistryLock {
 public:
  RegistryLock() {
    const std::string path = config().registry_dir + "/registry.lock";
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) Die("cannot open " + path + ": " + Errno());
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    while (fcntl(fd_, F_OFD_SETLKW, &lock) != 0) {
      if (errno != EINTR) Die("cannot lock " + path + ": " + Errno());
    }
  }
  ~RegistryLock() { close(fd_); }
  RegistryLock(const RegistryLock&) = delete;
  RegistryLock& operator=(const RegistryLock&) = delete;

 private:
  int fd_ = -1;
};

// Parses "alloc-d<device>-..." (the file name); -1 when it is not an allocation's name.
int DeviceOfName(const char* name) {
  if (std::strncmp(name, "alloc-d", 7) != 0) return -1;
  char* end = nullptr;
  const long device = std::strtol(name + 7, &end, 10);
  if (end == name + 7 || *end != '-') return -1;
  return static_cast<int>(device);
}

// The bytes alive on `device` in every process of the registry; deletes dead allocations' files.
// Caller holds a RegistryLock.
uint64_t LiveBytes(int device) {
  DIR* dir = opendir(config().registry_dir.c_str());
  if (dir == nullptr) Die("cannot read the registry " + config().registry_dir + ": " + Errno());
  uint64_t live = 0;
  while (const dirent* entry = readdir(dir)) {
    const int of = DeviceOfName(entry->d_name);
    if (of < 0) continue;
    const int fd = openat(dirfd(dir), entry->d_name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct flock probe {};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    probe.l_start = 0;
    probe.l_len = 1;
    struct stat st {};
    if (fcntl(fd, F_OFD_GETLK, &probe) != 0 || fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    close(fd);
    if (probe.l_type == F_UNLCK) {
      unlinkat(dirfd(dir), entry->d_name, 0);  // no reference anywhere: freed
    } else if (of == device) {
      live += static_cast<uint64_t>(st.st_size);
    }
  }
  closedir(dir);
  return live;
}

bool IsMultiple(uint64_t value, uint64_t of) { return value % of == 0; }

// The mapping that contains `address`, or end().
std::map<uintptr_t, Mapping>::iterator MappingAt(uintptr_t address) {
  auto& mappings = Mappings();
  auto it = mappings.upper_bound(address);
  if (it == mappings.begin()) return mappings.end();
  --it;
  return address < it->first + it->second.size ? it : mappings.end();
}

// True when [address, address + size) is exactly a run of whole, adjacent mappings; `first` and
// `last` (exclusive) delimit them.
bool WholeMappings(uintptr_t address, size_t size, std::map<uintptr_t, Mapping>::iterator* first,
                   std::map<uintptr_t, Mapping>::iterator* last) {
  auto& mappings = Mappings();
  auto it = mappings.find(address);
  if (it == mappings.end() || size == 0) return false;
  *first = it;
  uintptr_t at = address;
  const uintptr_t end = address + size;
  while (at < end) {
    if (it == mappings.end() || it->first != at) return false;
    at += it->second.size;
    ++it;
  }
  *last = it;
  return at == end;
}

// The reservation containing [address, address + size), or end().
std::map<uintptr_t, size_t>::iterator ReservationOf(uintptr_t address, size_t size) {
  auto& reservations = Reservations();
  auto it = reservations.upper_bound(address);
  if (it == reservations.begin()) return reservations.end();
  --it;
  if (address + size <= it->first + it->second && address >= it->first) return it;
  return reservations.end();
}

bool ValidDeviceLocation(const CUmemLocation& location) {
  return location.type == CU_MEM_LOCATION_TYPE_DEVICE && ValidDevice(location.id);
}

CUresult RequireVmm(const char* fn) {
  const CUresult init = RequireInit(fn);
  if (init != CUDA_SUCCESS) return init;
  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0: the VMM calls are refused.
  if (!config().vmm) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, fn,
                "virtual memory management is off (STASH_STANDIN_NO_VMM=1)");
  }
  return CUDA_SUCCESS;
}

}  // namespace

namespace {

// Under g_mu: where the registered host range holding `at` ends, or 0 when none holds it.
uintptr_t HostRangeEnd(uintptr_t at) {
  auto& hosts = HostRanges();
  auto h = hosts.upper_bound(at);
  if (h == hosts.begin()) return 0;
  --h;
  return at < h->first + h->second ? h->first + h->second : 0;
}

}  // namespace

bool DeviceAddressable(uintptr_t address, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const uintptr_t end = address + bytes;
  uintptr_t at = address;
  while (at < end) {
    auto m = MappingAt(at);
    const uintptr_t next = m != Mappings().end() ? m->first + m->second.size : HostRangeEnd(at);
    if (next == 0) return false;
    at = next;
  }
  return bytes > 0;
}

bool PinnedHost(uintptr_t address, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const uintptr_t end = address + bytes;
  for (uintptr_t at = address; at < end; at = HostRangeEnd(at)) {
    if (HostRangeEnd(at) == 0) return false;
  }
  return bytes > 0;
}

}  // namespace standin

using standin::Fail;

extern "C" __attribute__((visibility("default"))) long long stash_standin_device_bytes_in_use(
    int device) {
  if (!standin::Initialized() || !standin::ValidDevice(device)) return -1;
  std::lock_guard<std::mutex> lock(standin::g_mu);
  const standin::RegistryLock registry;
  return static_cast<long long>(standin::LiveBytes(device));
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  if (granularity == nullptr || prop == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "granularity or prop is NULL");
  }
  if (!standin::ValidDeviceLocation(prop->location)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__, "prop->location is not a valid device");
  }
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "unknown granularity option");
  }
  *granularity = standin::kGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  // CUDA Driver API, Virtual Memory Management, cuMemCreate: flags "must be zero now"; the size
  // "must be a multiple of" cuMemGetAllocationGranularity(MINIMUM); win32HandleMetaData "is
  // required to be zero" outside Windows.
  if (handle == nullptr || prop == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "handle or prop is NULL");
  }
  if (flags != 0) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "flags must be 0");
  if (size == 0 || !standin::IsMultiple(size, standin::kGranularity)) {
    return Fail(
        CUDA_ERROR_INVALID_VALUE, __func__,
        "size " + std::to_string(size) + " is not a positive multiple of the granularity (2 MiB)");
  }
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "prop->type must be PINNED");
  }
  if (!standin::ValidDeviceLocation(prop->location)) {
    return Fail(CUDA_ERROR_INVALID_DEVICE, __func__,
                "prop->location must be a device with a valid ordinal (host allocations are "
                "not modelled)");
  }
  if (prop->win32HandleMetaData != nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "win32HandleMetaData must be NULL on Linux");
  }
  const bool posix_fd = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE && !posix_fd) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "only CU_MEM_HANDLE_TYPE_NONE or POSIX_FILE_DESCRIPTOR handles are modelled");
  }
  if (posix_fd && !standin::config().posix_fd) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "POSIX file descriptor handles are off (STASH_STANDIN_NO_POSIX_FD=1)");
  }
  const int device = prop->location.id;
  std::lock_guard<std::mutex> lock(standin::g_mu);
  const standin::RegistryLock registry;
  const uint64_t live = standin::LiveBytes(device);
  const uint64_t budget = standin::config().vram_bytes;
  if (live + size > budget) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__,
                "device " + std::to_string(device) + " has " + std::to_string(live) +
                    " bytes alive in all processes of the registry; " + std::to_string(size) +
                    " more would exceed its " + std::to_string(budget) +
                    " bytes (STASH_STANDIN_VRAM_BYTES)");
  }
  const std::string path = standin::config().registry_dir + "/alloc-d" + std::to_string(device) +
                           "-" + std::to_string(getpid()) + "-" +
                           std::to_string(standin::g_next_file.fetch_add(1));
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__,
                "cannot create " + path + ": " + standin::Errno());
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || !standin::LockShared(fd)) {
    const std::string why = standin::Errno();
    close(fd);
    unlink(path.c_str());
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "cannot size or lock " + path + ": " + why);
  }
  // cuMemCreate promises nothing about the contents (the driver does not clear memory): new
  // allocations hold a non-zero pattern here, so code that needs zeros must write them.
  {
    const std::string garbage(size_t{1} << 16, static_cast<char>(0xA5));
    for (size_t at = 0; at < size; at += garbage.size()) {
      const size_t n = std::min(garbage.size(), size - at);
      if (pwrite(fd, garbage.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) break;
    }
  }
  const CUmemGenericAllocationHandle h = standin::g_next_handle++;
  standin::Handles()[h] = standin::Handle{fd, size, device, posix_fd};
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto it = standin::Handles().find(handle);
  // cuMemRelease: "If handle is not a valid handle the behavior is undefined"; the stand-in
  // refuses it (a double release is the usual cause).
  if (it == standin::Handles().end()) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "not a live allocation handle (released twice, or never created)");
  }
  // cuMemRelease: "The memory allocation will be freed when all outstanding mappings to the
  // memory are unmapped and when all outstanding references to the handle (including its
  // shareable counterparts) are also released." Mappings and exported descriptors hold their
  // own references, so only this handle's goes.
  close(it->second.fd);
  standin::Handles().erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  if (shareableHandle == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "shareableHandle is NULL");
  }
  if (flags != 0) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "flags must be 0");
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is modelled");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto it = standin::Handles().find(handle);
  if (it == standin::Handles().end()) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live allocation handle");
  }
  // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: exporting to a descriptor
  // works "if requested via cuMemCreate" (prop.requestedHandleTypes).
  if (!it->second.exportable) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the allocation was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
                "prop.requestedHandleTypes");
  }
  const int fd = standin::NewReference(it->second.fd);
  if (fd < 0) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__,
                "cannot open a descriptor: " + standin::Errno());
  }
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  if (handle == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "handle is NULL");
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is modelled");
  }
  // For POSIX descriptors the driver takes the descriptor itself, cast to a pointer.
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  std::string target(4096, '\0');
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), target.data(), target.size() - 1);
  if (n <= 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "descriptor " + std::to_string(fd) + " is not open: " + standin::Errno());
  }
  target.resize(static_cast<size_t>(n));
  const std::string prefix = standin::config().registry_dir + "/";
  const size_t slash = target.rfind('/');
  const int device =
      slash == std::string::npos ? -1 : standin::DeviceOfName(target.c_str() + slash + 1);
  struct stat st {};
  if (target.compare(0, prefix.size(), prefix) != 0 || device < 0 || fstat(fd, &st) != 0 ||
      !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      !standin::IsMultiple(static_cast<uint64_t>(st.st_size), standin::kGranularity)) {
    // cuMemImportFromShareableHandle: "If the current process cannot support the memory
    // described by this shareable handle, this API will error as CUDA_ERROR_NOT_SUPPORTED."
    return Fail(CUDA_ERROR_NOT_SUPPORTED, __func__,
                "descriptor " + std::to_string(fd) + " (" + target +
                    ") is not an allocation exported by the stand-in of this registry (" +
                    standin::config().registry_dir + ")");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  const int ref = standin::NewReference(fd);
  if (ref < 0) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "cannot open a reference: " + standin::Errno());
  }
  // A new handle to the same memory ("There is no guarantee that the contents of handle will be
  // the same CUDA memory handle for the same given OS shareable handle"): each import is its own
  // reference, paired with its own cuMemRelease.
  const CUmemGenericAllocationHandle h = standin::g_next_handle++;
  standin::Handles()[h] = standin::Handle{ref, static_cast<size_t>(st.st_size), device, true};
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  (void)addr;  // "a hint about where to place the reservation": the stand-in ignores it
  // cuMemAddressReserve: "The size and address parameters must be a multiple of the host page
  // size and the alignment must be a power of two or zero for default alignment"; flags must be
  // zero.
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (ptr == nullptr) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "ptr is NULL");
  if (flags != 0) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "flags must be 0");
  if (size == 0 || size % page != 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "size " + std::to_string(size) + " is not a positive multiple of the page size");
  }
  if ((alignment & (alignment - 1)) != 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "alignment " + std::to_string(alignment) + " is not a power of two");
  }
  const size_t align = std::max(alignment == 0 ? standin::kGranularity : alignment, page);
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "mmap: " + standin::Errno());
  }
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) & ~(uintptr_t{align} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t tail = start + size + align - (aligned + size);
  if (tail > 0) munmap(standin::HostPointer(aligned + size), tail);
  std::lock_guard<std::mutex> lock(standin::g_mu);
  standin::Reservations()[aligned] = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto it = standin::Reservations().find(ptr);
  // cuMemAddressFree: "The size must match what was given to memAddressReserve and the ptr given
  // must match what was returned from memAddressReserve."
  if (it == standin::Reservations().end() || it->second != size) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "ptr and size must be exactly a reservation cuMemAddressReserve returned");
  }
  // Stricter than the reference, which does not say what freeing a range with mappings does:
  // cuMemUnmap "converts" a mapped range back "to an address reservation", so mappings come off
  // first.
  auto m = standin::Mappings().lower_bound(ptr);
  if (m != standin::Mappings().end() && m->first < ptr + size) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the reservation still has mappings: cuMemUnmap them before cuMemAddressFree");
  }
  // The range stays PROT_NONE for good so that late work faults (see the file comment).
  standin::Reservations().erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  if (flags != 0) return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "flags must be 0");
  // cuMemMap, parameter offset: "Note: currently must be zero." (The description also allows
  // granularity multiples; the parameter note is the stricter reading and the one enforced.)
  if (offset != 0) {
    return Fail(
        CUDA_ERROR_INVALID_VALUE, __func__,
        "offset " + std::to_string(offset) + " must be 0 (cuMemMap: currently must be zero)");
  }
  // cuMemMap: "Both ptr, size, and offset must be a multiple of the value given via
  // cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag."
  if (size == 0 || !standin::IsMultiple(ptr, standin::kGranularity) ||
      !standin::IsMultiple(size, standin::kGranularity)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "ptr and size must be positive multiples of the granularity (2 MiB)");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto h = standin::Handles().find(handle);
  if (h == standin::Handles().end()) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not a live allocation handle");
  }
  // cuMemMap: "offset + size must be less than [or equal to] the size of the memory allocation".
  if (size > h->second.size) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "size " + std::to_string(size) + " is over the allocation's " +
                    std::to_string(h->second.size) + " bytes");
  }
  // cuMemMap: "This range must be an address reservation previously reserved with
  // cuMemAddressReserve".
  if (standin::ReservationOf(ptr, size) == standin::Reservations().end()) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the range is not inside one cuMemAddressReserve reservation");
  }
  // cuMemMap "can only create mappings on VA range reservations that are not currently mapped."
  auto next = standin::Mappings().lower_bound(ptr);
  const bool overlaps_next = next != standin::Mappings().end() && next->first < ptr + size;
  if (overlaps_next || standin::MappingAt(ptr) != standin::Mappings().end()) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "the range is already (partly) mapped");
  }
  const int ref = standin::NewReference(h->second.fd);
  if (ref < 0) {
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "cannot open a reference: " + standin::Errno());
  }
  // cuMemMap: "calling cuMemMap does not make the address accessible": PROT_NONE until
  // cuMemSetAccess.
  void* at = mmap(standin::HostPointer(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, ref, 0);
  if (at == MAP_FAILED) {
    const std::string why = standin::Errno();
    close(ref);
    return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "mmap: " + why);
  }
  standin::Mappings()[ptr] = standin::Mapping{size, ref, h->second.device, PROT_NONE};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  std::map<uintptr_t, standin::Mapping>::iterator first;
  std::map<uintptr_t, standin::Mapping>::iterator last;
  // cuMemUnmap: "The range must be the entire contiguous address range that was mapped to. In
  // other words, cuMemUnmap cannot unmap a sub-range of an address range mapped by cuMemCreate /
  // cuMemMap."
  if (!standin::WholeMappings(ptr, size, &first, &last)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the range is not exactly one or more whole, adjacent mappings");
  }
  // "When cuMemUnmap returns successfully the address range is converted to an address
  // reservation": PROT_NONE again. The stand-in does not wait for queued work that uses the
  // range (the reference promises synchronous behaviour only "for most use cases"): such work
  // faults.
  void* at = mmap(standin::HostPointer(ptr), size, PROT_NONE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (at == MAP_FAILED) standin::Die("cuMemUnmap: mmap over the range failed: " + standin::Errno());
  for (auto it = first; it != last; ++it) close(it->second.fd);  // the mappings' references
  standin::Mappings().erase(first, last);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  STANDIN_TRY(standin::RequireVmm(__func__));
  if (desc == nullptr || count == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "no access descriptors");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  std::map<uintptr_t, standin::Mapping>::iterator first;
  std::map<uintptr_t, standin::Mapping>::iterator last;
  // cuMemSetAccess: "The range must be a fully mapped address range containing all allocations
  // created by cuMemMap / cuMemCreate."
  if (!standin::WholeMappings(ptr, size, &first, &last)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the range is not fully mapped by whole mappings");
  }
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (!standin::ValidDeviceLocation(desc[i].location)) {
      return Fail(CUDA_ERROR_INVALID_DEVICE, __func__,
                  "desc[" + std::to_string(i) + "].location is not a valid device");
    }
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE:
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ:
        prot |= PROT_READ;
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        prot |= PROT_READ | PROT_WRITE;
        break;
      default:
        return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                    "desc[" + std::to_string(i) + "].flags is not a CUmemAccess_flags value");
    }
    for (auto it = first; it != last; ++it) {
      // Access from another device needs peer access (cuDeviceCanAccessPeer).
      if (desc[i].location.id != it->second.device && !standin::config().peer &&
          desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        return Fail(CUDA_ERROR_INVALID_DEVICE, __func__,
                    "device " + std::to_string(desc[i].location.id) + " cannot access device " +
                        std::to_string(it->second.device) +
                        "'s memory (peer access is off: STASH_STANDIN_NO_PEER=1)");
      }
    }
  }
  // One host address space stands in for every device's: the range gets the widest access
  // any descriptor grants.
  for (auto it = first; it != last; ++it) {
    const int wanted = it->second.prot | prot;
    if (mprotect(standin::HostPointer(it->first), it->second.size, wanted) != 0) {
      return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "mprotect: " + standin::Errno());
    }
    it->second.prot = wanted;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t* free, size_t* total) {
  STANDIN_TRY(standin::RequireInit(__func__));
  int device = 0;
  // cuMemGetInfo reports the memory "available to the current context".
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  if (free == nullptr || total == nullptr) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "free or total is NULL");
  }
  std::lock_guard<std::mutex> lock(standin::g_mu);
  const standin::RegistryLock registry;
  const uint64_t live = standin::LiveBytes(device);
  const uint64_t budget = standin::config().vram_bytes;
  *total = budget;
  *free = live >= budget ? 0 : budget - live;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto m = standin::MappingAt(dptr);
  if (m == standin::Mappings().end()) {
    return Fail(CUDA_ERROR_NOT_FOUND, __func__, "the address is not in a stand-in mapping");
  }
  if (pbase != nullptr) *pbase = m->first;
  if (psize != nullptr) *psize = m->second.size;
  return CUDA_SUCCESS;
}

// ---- Host registration: host memory the device (here: stream work) may address ------------------

CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  int device = 0;
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  (void)Flags;
  if (p == nullptr || bytesize == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "empty range");
  }
  const auto base = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto& ranges = standin::HostRanges();
  auto next = ranges.lower_bound(base);
  auto prev = next == ranges.begin() ? ranges.end() : std::prev(next);
  // cuMemHostRegister: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED when part of the range is.
  if ((next != ranges.end() && next->first < base + bytesize) ||
      (prev != ranges.end() && prev->first + prev->second > base)) {
    return Fail(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, __func__,
                "the range overlaps a registered one");
  }
  ranges[base] = bytesize;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  STANDIN_TRY(standin::RequireInit(__func__));
  std::lock_guard<std::mutex> lock(standin::g_mu);
  // cuMemHostUnregister: p is the base address of a registered range, else
  // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
  if (standin::HostRanges().erase(reinterpret_cast<uintptr_t>(p)) == 0) {
    return Fail(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, __func__,
                "not the base of a registered range");
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  // cuMemHostGetDevicePointer: "Flags provided for future releases. For now, it must be set
  // to 0."
  if (pdptr == nullptr || Flags != 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "pdptr is NULL or Flags is not 0");
  }
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(standin::g_mu);
  auto& ranges = standin::HostRanges();
  auto it = ranges.upper_bound(address);
  if (it == ranges.begin() || address >= std::prev(it)->first + std::prev(it)->second) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "p is not in registered host memory");
  }
  *pdptr = address;  // unified addressing: the same address
  return CUDA_SUCCESS;
}

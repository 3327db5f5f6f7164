// Shared memory regions: client memory on the host backend and the host backend's tiers
// (docs/design.md). Every region is a memfd: it has no name, so no other process can open it, and
// it disappears when the last mapping and descriptor are gone (a SIGKILLed client leaves nothing
// behind). Client memory is handed to the daemon as a file descriptor over the descriptor
// channel (daemon/server/descriptor_server.h), sealed so that nobody can shrink it under a mapping.
#ifndef STASH_COMMON_SHM_H_
#define STASH_COMMON_SHM_H_

#include <fcntl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash {

// The seals a client memfd must carry before the daemon maps it: its size can never change
// again (no shrink: a mapping past the end would SIGBUS; no grow; no further seals, so nobody
// can add a write seal later either).
constexpr unsigned kClientMemorySeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW;

// A memfd named `label` (for /proc) of `bytes` bytes (> 0), zero-filled, sealed with
// kClientMemorySeals: its size never changes, so no mapping of it can ever fault.
// With `hugetlb`, its pages come from the kernel's huge page pool (MFD_HUGETLB, the default
// huge page size; `bytes` a multiple of it).
StatusOr<UniqueFd> CreateSealedMemfd(const std::string& label, uint64_t bytes,
                                     bool hugetlb = false);

// A PMD-sized transparent huge page (x86-64, and arm64 with 4 KiB base pages).
constexpr uint64_t kHugePageBytes = 2ULL << 20;

// `mapping` is a reservation of `bytes + align` bytes just made (`align` a power of two, or 0):
// unmaps what lies before its first `align` boundary and past `bytes` after it, and returns that
// boundary (`mapping` itself when align is 0), so a huge page can map whole inside.
uint8_t* TrimToAlignment(uint8_t* mapping, uint64_t bytes, uint64_t align);

// The setting in force of /sys/kernel/mm/transparent_hugepage/shmem_enabled (the bracketed word
// of "always within_size [advise] never deny force"): "" where the file is missing. always,
// within_size, advise and force let memfds take transparent huge pages (advise: when asked by
// MADV_HUGEPAGE).
std::string ShmemHugePageSetting();
bool ShmemHugePagesOffered(const std::string& setting);

// Writes each page of the mapped range [start, start + size) once without changing a byte (start
// 8-byte aligned; a page's start in use): an atomic OR of zero into its first word, which a copy
// running into the page meanwhile cannot interleave with. Populated pages may still trap on
// their first write under a hypervisor (measured on the 2-core VM: a 256 MiB memfd after
// MADV_POPULATE_WRITE took its first memset at 0.4-0.6 GB/s, at 11-20 GB/s once each page had
// been written through the same mapping; docs/design.md, "Warm memory"). It must be the mapping
// that later copies use: a write through another mapping of the same pages did not help. This
// moves the cost to whoever warms the memory.
void WriteEachPage(uint8_t* start, uint64_t size);

// Allocates every page of [0, bytes) of memfd `fd` now (fallocate), without changing its size
// or any byte; false when memory is short (the pages then come as they are first touched).
bool AllocatePages(int fd, uint64_t bytes);

// Checks that `fd` may be mapped read-write for [0, bytes): a memfd opened read-write, carrying
// kClientMemorySeals and no write seal, holding at least `bytes` (> 0) bytes. INVALID_ARGUMENT
// that says what is wrong and how to allocate such memory otherwise.
Status CheckClientMemoryFd(int fd, uint64_t bytes);

// One mapped memfd region. Not copyable; unmaps on destruction. Thread-compatible: data() may be
// used from any thread.
class SharedMemory {
 public:
  // Creates a memfd named `label` (for /proc) of `bytes` bytes (> 0), zero-filled, sealed with
  // kClientMemorySeals, maps it read-write and keeps the descriptor (fd()) to hand to the daemon.
  static StatusOr<std::unique_ptr<SharedMemory>> CreateSealed(const std::string& label,
                                                              uint64_t bytes);

  // Maps [0, bytes) of a client memfd after CheckClientMemoryFd; the descriptor is closed once
  // mapped (the mapping keeps the memory alive).
  static StatusOr<std::unique_ptr<SharedMemory>> MapClientFd(UniqueFd fd, uint64_t bytes);

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The memfd of a CreateSealed region; -1 for the others.
  int fd() const { return fd_.get(); }

 private:
  SharedMemory(UniqueFd fd, uint8_t* data, uint64_t size)
      : fd_(std::move(fd)), data_(data), size_(size) {}

  UniqueFd fd_;
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace stash

#endif  // STASH_COMMON_SHM_H_

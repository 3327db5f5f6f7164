// Shared memory regions: the host backend's stand-in for device memory (DESIGN.md §6).
#ifndef STASH_COMMON_SHM_H_
#define STASH_COMMON_SHM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "stash/status.h"

namespace stash {

// One mapped region of POSIX shared memory (or an anonymous memfd). Not copyable; unmaps on
// destruction, and unlinks the name if this object created it and has not unlinked it yet.
// Thread-compatible: data() may be used from any thread, Unlink() from one.
class SharedMemory {
 public:
  // Creates a new shm object named "/stashd-<pid>-<32 random hex>" (mode 0600) of `bytes`
  // bytes (> 0), zero-filled, and maps it read-write.
  static StatusOr<std::unique_ptr<SharedMemory>> Create(uint64_t bytes);

  // Opens the existing shm object `name` and maps it read-write. FAILED_PRECONDITION when the
  // object is smaller than `bytes`; NOT_FOUND when there is no such object; INVALID_ARGUMENT
  // when the name is not of the form "/stashd-...".
  static StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name, uint64_t bytes);

  // An anonymous memfd region of `bytes` bytes named `label` (for /proc), mapped read-write
  // without reserving swap; pages are allocated on first touch.
  static StatusOr<std::unique_ptr<SharedMemory>> CreateAnonymous(const std::string& label,
                                                                 uint64_t bytes);

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The shm name ("" for anonymous regions).
  const std::string& name() const { return name_; }

  // Removes the name so no further process can open it; existing mappings stay valid. Only
  // the creator's object does this; ForceUnlink does it for an opened one too (the daemon, when
  // the process that created the memory is gone).
  void Unlink();
  void ForceUnlink();

 private:
  SharedMemory(std::string name, uint8_t* data, uint64_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}

  std::string name_;
  uint8_t* data_;
  uint64_t size_;
  bool owner_;  // created here and not yet unlinked
};

}  // namespace stash

#endif  // STASH_COMMON_SHM_H_

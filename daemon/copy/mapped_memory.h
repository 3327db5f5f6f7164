// Client memory as a copy executor opened it (copy/executor.h): where copies address it, and
// where the daemon's CPU reads it.
#ifndef STASH_DAEMON_MAPPED_MEMORY_H_
#define STASH_DAEMON_MAPPED_MEMORY_H_

#include <cstdint>

namespace stash::daemon {

// A client allocation the daemon opened for one session. Closing (destruction) must happen only
// after every copy that uses it finished (the pool fences first).
class MappedMemory {
 public:
  virtual ~MappedMemory() = default;
  // Where copies address byte 0 (a host address for host memory, a device address in the
  // daemon's context for CUDA memory and for host memory the CUDA executor registered).
  uint8_t* data() const { return data_; }
  // Where the daemon's CPU reads byte 0; null for device memory.
  uint8_t* host() const { return host_; }
  uint64_t bytes() const { return bytes_; }

 protected:
  MappedMemory(uint8_t* data, uint8_t* host, uint64_t bytes)
      : data_(data), host_(host), bytes_(bytes) {}

 private:
  uint8_t* data_;
  uint8_t* host_;
  uint64_t bytes_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_MAPPED_MEMORY_H_

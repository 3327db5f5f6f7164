// The library's side of a HostBuffer (client/api/client.cc; shared with the session stream and
// mapped mode, which keep a buffer's memory mapped while an operation on it is queued).
#ifndef STASH_CLIENT_HOST_BUFFER_REP_H_
#define STASH_CLIENT_HOST_BUFFER_REP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "common/shm.h"
#include "stash/client.h"

namespace stash {

struct HostBuffer::Rep {
  // Shared: an operation whose done event lives here keeps it mapped until it is answered, even
  // when the caller frees the HostBuffer first (the library raises done events itself).
  std::shared_ptr<SharedMemory> memory;
  uint64_t id = 0;
  // Cuda backend: the buffer mapped for the GPU on first EnqueueSignal / EnqueueWait.
  std::mutex map_mu;
  uint64_t device_address = 0;    // guarded by map_mu
  std::function<void()> release;  // guarded by map_mu
};

}  // namespace stash

#endif  // STASH_CLIENT_HOST_BUFFER_REP_H_

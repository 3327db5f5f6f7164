// Options of a stashd client session.
#ifndef STASH_OPTIONS_H_
#define STASH_OPTIONS_H_

#include <cstdint>
#include <string>

namespace stash {

// Where the daemon keeps stashed rows; the client must match the daemon it talks to.
enum class Backend {
  kHost,  // shared memory (memfds) stands in for GPU memory (CI, laptops): buffers are HostBuffers
  kCuda,  // NVIDIA GPUs: buffers are device pointers shared through CUDA IPC
};

struct Options {
  // The daemon's Unix socket. Empty (the default) = $STASHD_SOCKET, else
  // /run/stashd/stashd.sock, else the per-user fallback a daemon without /run access uses.
  std::string socket;

  // The daemon's backend. Default kHost; kCuda needs the NVIDIA driver and a daemon started
  // with --backend=cuda (or auto on a GPU node).
  Backend backend = Backend::kHost;

  // The device this rank trains on. Host backend: the simulated GPU index, in
  // [0, stashd --devices). Cuda backend: the CUDA device ordinal as this process sees it (after
  // CUDA_VISIBLE_DEVICES); the daemon finds its pool by the device's UUID. Default 0.
  int device = 0;

  // The rank's global rank, shown by `stashctl sessions`; -1 (default) = unknown.
  int64_t rank = -1;

  // A free-form label shown by `stashctl sessions` (job name, host); default empty.
  std::string label;

  // Whether stashes may spill to the daemon's host tier when this rank's pool is full.
  // Default true; false makes a full pool overflow.
  bool allow_host_spill = true;

  // How long Open() waits for the daemon to answer, in milliseconds. Default 5000.
  int64_t connect_timeout_ms = 5000;
};

}  // namespace stash

#endif  // STASH_OPTIONS_H_

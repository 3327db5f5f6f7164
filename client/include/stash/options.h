// Options of a stashd client session.
#ifndef STASH_OPTIONS_H_
#define STASH_OPTIONS_H_

#include <cstdint>
#include <string>

namespace stash {

struct Options {
  // The daemon's Unix socket. Empty (the default) = $STASHD_SOCKET, else
  // /run/stashd/stashd.sock, else the per-user fallback a daemon without /run access uses.
  std::string socket;

  // The device this rank trains on: the simulated GPU index on the host backend, in
  // [0, stashd --devices). Default 0.
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

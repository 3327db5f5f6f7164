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

// Who runs the copies (docs/design.md, "Mapped mode"; README, "Which mode").
enum class Mode {
  // The client registers its buffers and the daemon copies them, one request per operation.
  kDaemonCopy,
  // The daemon leases pool chunks to this process, which maps them and pages its activations
  // itself, on its own in-order copier: no message per operation, and stashes made survive a
  // daemon restart. Both backends: on the cuda backend the chunks are VMM memory on the GPUs
  // and the pages move with the library's kernels on the caller's stream.
  kMapped,
};

// How much a mapped session leases of each tier.
struct Lease {
  // True (the default): the daemon sizes the lease at each BeginStep from the step before (its
  // demand's high water plus 1/8; a step with no stash tried is no sample); the first lease is
  // half the own device's free chunks, within the quota (stashd --max-lease-bytes, per tier).
  // The round trip runs on the session's lease thread; BeginStep waits for it up to 50 ms, then
  // it lands between two later operations (and later steps stop waiting until the daemon
  // answers in time again): a hung daemon never stalls stashes. A rank that outgrows its lease
  // mid-step asks at once. False: the bytes below, rounded up to whole chunks.
  bool automatic = true;
  uint64_t device_bytes = 0;  // the own device's pool
  uint64_t peer_bytes = 0;    // other devices' spare chunks (asked only of a --peer-tier daemon)
  uint64_t host_bytes = 0;    // the host tier (asked only with allow_host_spill and a host tier)
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

  // Who runs the copies. Default kDaemonCopy.
  Mode mode = Mode::kDaemonCopy;

  // Mapped mode: the lease. Default automatic.
  Lease lease;

  // Mapped mode: threads of the in-order copier that split one large copy (1 = the copier's own
  // thread only). Default 2, the daemon's --copy-threads default.
  uint32_t copy_threads = 2;

  // The group of sessions this one joins: the sessions of one job on this node (docs/security.md,
  // "Groups"). Default empty = no group, the session shares nothing. Otherwise 1-128 bytes of
  // A-Z a-z 0-9 . _ : @ + -. The first session naming a group creates it for this process's Unix
  // user and `group_secret`; Open() of a later one fails PERMISSION_DENIED when the group
  // belongs to another user or was created with another secret.
  // With neither `group` nor `group_secret` set, Open() takes them from $STASHD_GROUP and
  // $STASHD_GROUP_SECRET (64 hex characters; anything else is INVALID_ARGUMENT naming the
  // variable). One set without the other (here or in the environment) is INVALID_ARGUMENT.
  std::string group;

  // The group's secret: exactly 32 raw bytes (any values) when `group` is set, else empty
  // (the default). Every member of a group presents the secret its first member set: draw it
  // once per job (e.g. 32 random bytes on rank 0) and hand it to every rank of the node.
  std::string group_secret;
};

}  // namespace stash

#endif  // STASH_OPTIONS_H_

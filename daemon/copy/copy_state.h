// Daemon-copy's state of one session: the client memory it registered, opened, and the stashes
// it holds. Kept on the session (Session::mode_state) so it ends with it, and touched only by the
// holder of the session's pool's run token (copy/pool.h).
#ifndef STASH_DAEMON_COPY_STATE_H_
#define STASH_DAEMON_COPY_STATE_H_

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <memory>

#include "daemon/copy/executor.h"
#include "daemon/sessions/session.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// A registered client allocation as the pool worker sees it: mapped, or why it is not. Shared,
// because work in flight on an asynchronous executor keeps it open until that work finished.
struct ClientMemory {
  std::shared_ptr<MappedMemory> mapping;  // null when opening failed
  Status open_status;
  uint64_t bytes = 0;
};

struct CopyState final : ModeState {
  // The session's state, made on first use. Run token holder only.
  static CopyState& Of(Session& session) {
    if (session.mode_state() == nullptr) session.set_mode_state(std::make_unique<CopyState>());
    return static_cast<CopyState&>(*session.mode_state());
  }

  // The mapped bytes of `ref` in the session's memory, or why not. Ranges were checked against
  // the registered size before queueing; this only fails when the registration itself failed.
  StatusOr<uint8_t*> Resolve(const stash::v1::MemoryRef& ref) const;
  // The CPU address of `ref` (ready counters), or null when the memory is not host memory.
  const uint64_t* HostCounter(const stash::v1::MemoryRef& ref) const;

  absl::flat_hash_map<uint64_t, ClientMemory> memories;
  // Live stashes by ticket, from their Stash until their Reload or Release was submitted. Shared
  // with the work in flight that fills them in.
  absl::flat_hash_map<uint64_t, std::shared_ptr<StashRecord>> stashes;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_COPY_STATE_H_

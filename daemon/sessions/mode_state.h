// A mode's own state of a session, kept on the session (Session::mode_state).
#ifndef STASH_DAEMON_MODE_STATE_H_
#define STASH_DAEMON_MODE_STATE_H_

namespace stash::daemon {

// What a mode keeps of each session beside its identity (daemon-copy: copy/copy_state.h). The
// session owns it, so it lives exactly as long as the session; only that mode's code reads it.
class ModeState {
 public:
  virtual ~ModeState() = default;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_MODE_STATE_H_

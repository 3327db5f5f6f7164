// Daemon-copy mode over time (docs/design.md, "Recovery and draining"): the session stream new
// operations go to, and what a daemon that died, restarted or drained leaves behind.
//
// - A stream that broke (the daemon died, restarted or stopped) is replaced at the next
//   BeginStep once a daemon answers (attempts back off while none does, and a daemon that
//   started since is tried at once: client/session/reconnect_backoff.h). The stashes the broken
//   session held are lost: their reloads and releases fail at once with UNAVAILABLE naming the
//   ticket and the session. Operations sent to the old stream stay waitable (its streams are kept
//   until nothing of theirs is pending).
// - A stream whose daemon drains (a DaemonState message) takes no stash: the library answers
//   stashes itself (OVERFLOW: nothing taken, the caller keeps its buffer, and the step's
//   overflow flag stays clear: nothing was lost). Reloads and releases go on; once no stash is
//   live and nothing is pending the session ends, and the next BeginStep that finds a daemon
//   taking sessions again opens a new one (until then BeginStep is answered here, OK).
//
// Thread-safe: every method may be called from any thread at the same time.
#ifndef STASH_CLIENT_COPY_SESSION_H_
#define STASH_CLIENT_COPY_SESSION_H_

#include <absl/base/thread_annotations.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/memory/cuda_memory.h"
#include "client/session/argument_checks.h"
#include "client/session/mode_session.h"
#include "client/session/reconnect_backoff.h"
#include "client/session/session_stream.h"
#include "common/mutex.h"
#include "stash/client.h"

namespace stash::client {

class CopySession final : public ModeSession {
 public:
  // Opens the first session (as Client::Open documents it).
  static StatusOr<std::unique_ptr<CopySession>> Open(const Options& options);
  CopySession(const CopySession&) = delete;
  CopySession& operator=(const CopySession&) = delete;
  ~CopySession() override;  // ends every session

  // The operations, as requests on the current stream (copy_operations.cc).
  StatusOr<uint64_t> Stash(const StashArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Reload(const ReloadArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Release(uint64_t ticket, void* gpu_stream) override;
  StatusOr<uint64_t> BeginStep(uint64_t step, void* gpu_stream) override;
  StatusOr<uint64_t> Unregister(const HostBuffer& buffer) override;
  StatusOr<uint64_t> UnregisterDevice(const void* pointer) override;
  Status ReleaseDeviceMappings(int64_t timeout_ms) override;
  Status GraphsDestroyed() override { return NoGraphsKept(); }

  // The stream new operations go to; null while drained (no session: answer with Local*).
  std::shared_ptr<SessionStream> Current() const;
  // The stream a reload or release of `ticket` goes to: the current one, or UNAVAILABLE when
  // the stash was held by a session that is gone (its rows are lost), or NOT_FOUND when no
  // session is open (drained: every stash came back before it ended).
  StatusOr<std::shared_ptr<SessionStream>> ForTicket(uint64_t ticket);
  // The stream a BeginStep goes to: the current one, or a new session when the current one
  // broke or drained and a daemon takes sessions. Null (answer the step here) while drained and
  // no daemon takes a session yet; UNAVAILABLE when the daemon is gone and no new one answers.
  StatusOr<std::shared_ptr<SessionStream>> ForStep();
  // Ends the current session if its daemon drains and nothing is left in it.
  void EndIfDrained();

  // An answer given here, handed out once by Wait / Poll; returns its operation id.
  uint64_t Local(Completion completion);
  // As Client::Wait / Client::Poll, over local answers and every stream, old ones too.
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms) override;
  std::optional<StatusOr<Completion>> Poll(uint64_t op) override;
  // The current step's flags (none while drained).
  StepFlags CurrentStepFlags() const override;
  // Stats of the current session; UNAVAILABLE while there is none or it broke.
  StatusOr<SessionStats> Stats() override;

  v1::Welcome welcome() const override;
  const std::string& socket() const override { return socket_; }
  Backend backend() const override { return options_.backend; }
  Mode mode() const override { return Mode::kDaemonCopy; }
  CudaSide* cuda() const override { return cuda_.get(); }

 private:
  CopySession(Options options, std::shared_ptr<CudaSide> cuda, std::string socket)
      : options_(std::move(options)), cuda_(std::move(cuda)), socket_(std::move(socket)) {}
  // Replaces the current stream by a new session (lock not held while connecting).
  StatusOr<std::shared_ptr<SessionStream>> Reconnect(const std::shared_ptr<SessionStream>& old);
  // The stream holding operation `op`, current or retired; null when none.
  std::shared_ptr<SessionStream> Holding(uint64_t op) const;

  // Never change after Open().
  const Options options_;
  const std::shared_ptr<CudaSide> cuda_;  // cuda backend only
  const std::string socket_;

  mutable Mutex mu_;
  std::shared_ptr<SessionStream> stream_ ABSL_GUARDED_BY(mu_);  // null while drained
  // Broken streams whose operations are not all handed out yet.
  std::vector<std::shared_ptr<SessionStream>> retired_ ABSL_GUARDED_BY(mu_);
  // Tickets of stashes held by a session that broke, and why they are lost.
  std::unordered_map<uint64_t, std::string> lost_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Completion> local_ ABSL_GUARDED_BY(mu_);
  v1::Welcome welcome_ ABSL_GUARDED_BY(mu_);       // the last session's
  ReconnectBackoff backoff_ ABSL_GUARDED_BY(mu_);  // when the next attempt may run
  Status last_failure_ ABSL_GUARDED_BY(mu_);       // why the last attempt failed
  bool connecting_ ABSL_GUARDED_BY(mu_) = false;   // one attempt at a time
};

}  // namespace stash::client

#endif  // STASH_CLIENT_COPY_SESSION_H_

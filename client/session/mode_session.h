// The session a Client holds: one implementation per mode, picked once by Client::Open
// (client/api/client.cc) so that nothing else looks at the mode:
//   CopySession        (client/copy/)        daemon-copy: the daemon copies registered memory;
//   MappedSession      (client/mapped/)      mapped mode on the host backend;
//   CudaMappedSession  (client/mapped/cuda/) mapped mode on GPUs, on the trainer's stream.
// Each method is the Client method of the same name (include/stash/client.h documents them);
// Client checked what every mode checks alike first (argument_checks.h: the stash's shape, the
// reload's ticket). Thread-safety as Client's: every method may be called from any thread.
#ifndef STASH_CLIENT_MODE_SESSION_H_
#define STASH_CLIENT_MODE_SESSION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "stash/client.h"

namespace stash::client {

class CudaSide;

class ModeSession {
 public:
  virtual ~ModeSession() = default;

  // `then_wait`: the caller Waits for the operation next (the *AndWait calls), so daemon-copy
  // writes the request on the caller's thread and its session thread sleeps on.
  virtual StatusOr<uint64_t> Stash(const StashArgs& args, bool then_wait) = 0;
  virtual StatusOr<uint64_t> Reload(const ReloadArgs& args, bool then_wait) = 0;
  virtual StatusOr<uint64_t> Release(uint64_t ticket, void* gpu_stream) = 0;
  virtual StatusOr<uint64_t> BeginStep(uint64_t step, void* gpu_stream) = 0;
  virtual StatusOr<uint64_t> Unregister(const HostBuffer& buffer) = 0;
  virtual StatusOr<uint64_t> UnregisterDevice(const void* pointer) = 0;
  virtual Status ReleaseDeviceMappings(int64_t timeout_ms) = 0;
  virtual StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms) = 0;
  virtual std::optional<StatusOr<Completion>> Poll(uint64_t op) = 0;
  virtual Status GraphsDestroyed() = 0;
  virtual StepFlags CurrentStepFlags() const = 0;
  virtual StatusOr<SessionStats> Stats() = 0;

  // The Welcome of the live session (of the last one while none is open).
  virtual v1::Welcome welcome() const = 0;
  virtual const std::string& socket() const = 0;
  virtual Backend backend() const = 0;
  virtual Mode mode() const = 0;
  // The GPU side EnqueueSignal / EnqueueWait use; null on the host backend.
  virtual CudaSide* cuda() const = 0;
};

}  // namespace stash::client

#endif  // STASH_CLIENT_MODE_SESSION_H_

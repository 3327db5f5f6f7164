#include "client/copy/copy_session.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "common/macros.h"
#include "common/random.h"
#include "common/socket_path.h"
#include "common/text.h"

namespace stash::client {

StatusOr<std::unique_ptr<CopySession>> CopySession::Open(const Options& options) {
  std::shared_ptr<CudaSide> cuda;
  if (options.backend == Backend::kCuda) {
    STASH_ASSIGN_OR_RETURN(cuda, CudaSide::Open(options.device));
  }
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<SessionStream> stream,
                         SessionStream::Open(options, v1::MODE_DAEMON_COPY, cuda));
  std::unique_ptr<CopySession> session(new CopySession(options, cuda, stream->socket));
  MutexLock lock(&session->mu_);
  session->welcome_ = stream->welcome;
  session->stream_ = std::move(stream);
  return session;
}

CopySession::~CopySession() {
  std::shared_ptr<SessionStream> current;
  std::vector<std::shared_ptr<SessionStream>> retired;
  {
    MutexLock lock(&mu_);
    current = std::move(stream_);
    retired.swap(retired_);
  }
  retired.clear();  // broken: each Close returns at once
  current.reset();  // a half-close: the daemon finishes the session's work first
}

std::shared_ptr<SessionStream> CopySession::Current() const {
  MutexLock lock(&mu_);
  return stream_;
}

v1::Welcome CopySession::welcome() const {
  MutexLock lock(&mu_);
  return welcome_;
}

StatusOr<std::shared_ptr<SessionStream>> CopySession::ForTicket(uint64_t ticket) {
  std::shared_ptr<SessionStream> s;
  {
    MutexLock lock(&mu_);
    auto lost = lost_.find(ticket);
    if (lost != lost_.end()) {
      Status st = UnavailableError(lost->second);
      lost_.erase(lost);
      return st;
    }
    s = stream_;
  }
  if (s == nullptr) {
    return NotFoundError("ticket " + Hex(ticket) +
                         " is not a live stash: this client holds no session with stashd on " +
                         socket_ +
                         " (it drained, and the session ended once every stash was back)");
  }
  if (s->holds_stash(ticket)) {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->broken) return UnavailableError(s->LostStash(ticket, s->broken_status.message()));
  }
  return s;
}

void CopySession::EndIfDrained() {
  std::shared_ptr<SessionStream> ended;
  {
    MutexLock lock(&mu_);
    if (stream_ == nullptr || !stream_->drained_now()) return;
    ended = stream_;
    // Still found by Wait: an operation queued on it after the check (an Unregister) is
    // answered there, or fails with the session's end (the next Reconnect drops it).
    retired_.push_back(std::move(stream_));
  }
  ended->Close();  // a half-close: the daemon ends the session, `stashctl sessions` drops it
}

StatusOr<std::shared_ptr<SessionStream>> CopySession::ForStep() {
  std::shared_ptr<SessionStream> s = Current();
  if (s != nullptr && !s->broken_now()) {
    if (!s->drained_now()) return s;
    EndIfDrained();
    s = nullptr;
  }
  StatusOr<std::shared_ptr<SessionStream>> fresh = Reconnect(s);
  if (fresh.ok()) return fresh;
  if (s == nullptr) return std::shared_ptr<SessionStream>();  // drained: the step runs here
  bool drained = false;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    drained = s->draining && s->live.empty();
    why = s->broken_status.message();
  }
  if (drained) {
    // The daemon stopped after its drain with nothing of ours left: nothing was lost, so the
    // steps run here until a daemon takes a session again.
    MutexLock lock(&mu_);
    if (stream_ == s) stream_ = nullptr;
    if (s->holds_any()) retired_.push_back(s);
    return std::shared_ptr<SessionStream>();
  }
  return UnavailableError(why + "; reconnecting failed too: " + fresh.status().message());
}

StatusOr<std::shared_ptr<SessionStream>> CopySession::Reconnect(
    const std::shared_ptr<SessionStream>& old) {
  const PathIdentity at_path = PathIdentity::Of(ClientSocketPath(options_.socket));
  const auto begun = ReconnectBackoff::Clock::now();
  {
    MutexLock lock(&mu_);
    if (stream_ != old) {
      // Another thread replaced it meanwhile.
      if (stream_ != nullptr) return stream_;
    }
    if (connecting_ || !backoff_.Due(begun, at_path)) {
      return last_failure_.ok() ? UnavailableError("reconnecting to stashd on " + socket_)
                                : last_failure_;
    }
    connecting_ = true;
  }
  auto opened = SessionStream::Open(options_, v1::MODE_DAEMON_COPY, cuda_);
  std::vector<std::shared_ptr<SessionStream>> drop;  // closed after the lock is released
  MutexLock lock(&mu_);
  connecting_ = false;
  if (!opened.ok()) {
    backoff_.Failed(begun, at_path);
    last_failure_ = opened.status();
    return opened.status();
  }
  backoff_.Succeeded();
  last_failure_ = Status::Ok();
  std::shared_ptr<SessionStream> fresh = std::move(opened).value();
  if (stream_ != nullptr) {
    SessionStream& o = *stream_;
    {
      std::lock_guard<std::mutex> olock(o.mu);
      const std::string why =
          o.broken ? o.broken_status.message() : std::string("the session ended");
      for (uint64_t ticket : o.live) lost_[ticket] = o.LostStash(ticket, why);
      o.live.clear();
    }
    retired_.push_back(std::move(stream_));
  }
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->holds_any()) {
      ++it;
    } else {
      drop.push_back(std::move(*it));
      it = retired_.erase(it);
    }
  }
  stream_ = fresh;
  welcome_ = fresh->welcome;
  return fresh;
}

std::shared_ptr<SessionStream> CopySession::Holding(uint64_t op) const {
  MutexLock lock(&mu_);
  if (stream_ != nullptr && stream_->holds(op)) return stream_;
  for (const auto& s : retired_) {
    if (s->holds(op)) return s;
  }
  return nullptr;
}

uint64_t CopySession::Local(Completion completion) {
  MutexLock lock(&mu_);
  uint64_t id = RandomNonZeroU64();
  while (local_.count(id) != 0) id = RandomNonZeroU64();
  if (completion.kind == Completion::Kind::kStash) completion.ticket = id;
  local_.emplace(id, completion);
  return id;
}

StatusOr<Completion> CopySession::Wait(uint64_t op, int64_t timeout_ms) {
  {
    MutexLock lock(&mu_);
    auto it = local_.find(op);
    if (it != local_.end()) {
      Completion c = it->second;
      local_.erase(it);
      return c;
    }
  }
  std::shared_ptr<SessionStream> s = Holding(op);
  if (s == nullptr) {
    return NotFoundError("operation " + std::to_string(op) +
                         " is not pending: unknown here, or its answer was already handed out");
  }
  StatusOr<Completion> answer = s->Wait(op, timeout_ms);
  if (s->draining_now()) EndIfDrained();
  return answer;
}

std::optional<StatusOr<Completion>> CopySession::Poll(uint64_t op) {
  std::shared_ptr<SessionStream> s = Holding(op);
  if (s != nullptr && !s->answered_now(op)) return std::nullopt;
  return Wait(op, 0);
}

StepFlags CopySession::CurrentStepFlags() const {
  std::shared_ptr<SessionStream> s = Current();
  if (s == nullptr) return StepFlags{};
  std::lock_guard<std::mutex> lock(s->mu);
  StepFlags flags = s->flags;
  flags.lost = s->broken && !s->live.empty();
  return flags;
}

StatusOr<SessionStats> CopySession::Stats() {
  std::shared_ptr<SessionStream> s = Current();
  if (s == nullptr) {
    return UnavailableError("no session is open with stashd on " + socket_ +
                            ": it drained, and the session ended once every stash was back; "
                            "the next BeginStep opens one once it takes sessions again");
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->broken) {
      return UnavailableError(s->broken_status.message() +
                              "; the next BeginStep opens a new session once a daemon answers");
    }
  }
  return s->Stats();
}

}  // namespace stash::client

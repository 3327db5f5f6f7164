#include "daemon/limits/fair_share.h"

#include <algorithm>
#include <utility>

namespace stash::daemon {

FairShare::FairShare(Spec spec) : spec_(std::move(spec)) {}

uint64_t FairShare::HeadroomLocked(uint32_t uid) const {
  const auto it = held_.find(uid);
  const uint64_t held = it != held_.end() ? it->second : 0;
  const uint64_t free = spec_.capacity > used_ ? spec_.capacity - used_ : 0;
  // Its first session's worth, as far as the budget has it; or what leaves `first` free.
  const uint64_t own = held < spec_.first ? std::min(free, spec_.first - held) : 0;
  const uint64_t spare = free > spec_.first ? free - spec_.first : 0;
  uint64_t room = std::max(own, spare);
  if (spec_.per_user != 0) room = std::min(room, spec_.per_user > held ? spec_.per_user - held : 0);
  return room;
}

uint64_t FairShare::Headroom(uint32_t uid) const {
  MutexLock lock(&mu_);
  return HeadroomLocked(uid);
}

Status FairShare::Take(uint32_t uid, uint64_t n) {
  MutexLock lock(&mu_);
  if (n <= HeadroomLocked(uid)) {
    used_ += n;
    held_[uid] += n;
    return Status::Ok();
  }
  const auto it = held_.find(uid);
  const uint64_t held = it != held_.end() ? it->second : 0;
  std::string why;
  if (spec_.per_user != 0 && held + n > spec_.per_user) {
    why = "uid " + std::to_string(uid) + " holds " + std::to_string(held) + " of stashd's " +
          spec_.what + ", and " + std::to_string(n) + " more would pass the limit of " +
          std::to_string(spec_.per_user) + " per user";
  } else if (used_ + n > spec_.capacity && held < spec_.first) {
    why = "stashd's " + spec_.what + " are all in use (" + std::to_string(used_) + " of " +
          std::to_string(spec_.capacity) + ", " + std::to_string(held) + " by uid " +
          std::to_string(uid) + ")";
  } else {
    why = "stashd has " + std::to_string(used_) + " of its " + std::to_string(spec_.capacity) +
          " " + spec_.what + " in use, " + std::to_string(held) + " by uid " + std::to_string(uid) +
          "; " + std::to_string(n) + " more would leave less than " + std::to_string(spec_.first) +
          " free, the share kept for another user's first session";
  }
  return ResourceExhaustedError(why + ": " + spec_.advice);
}

void FairShare::Give(uint32_t uid, uint64_t n) {
  MutexLock lock(&mu_);
  const auto it = held_.find(uid);
  if (it == held_.end()) return;
  n = std::min(n, it->second);
  it->second -= n;
  used_ -= n;
  if (it->second == 0) held_.erase(it);
}

uint64_t FairShare::used() const {
  MutexLock lock(&mu_);
  return used_;
}

uint64_t FairShare::Held(uint32_t uid) const {
  MutexLock lock(&mu_);
  const auto it = held_.find(uid);
  return it != held_.end() ? it->second : 0;
}

}  // namespace stash::daemon

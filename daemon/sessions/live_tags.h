// What a session holds now, by the tags its stashes carry (layer, microbatch, name), for
// `stashctl sessions --detail`. Thread-safe: the pool worker adds and removes, stats read.
#ifndef STASH_DAEMON_LIVE_TAGS_H_
#define STASH_DAEMON_LIVE_TAGS_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

class LiveTags {
 public:
  // A stash that took data (ticket) now holds `bytes` in `pages`.
  void Add(uint64_t ticket, uint32_t layer, uint32_t microbatch, const std::string& name,
           uint64_t bytes, uint64_t pages);
  // Its reload or release finished; unknown tickets are ignored.
  void Remove(uint64_t ticket);
  // The session ended.
  void Clear();

  // One row per (layer, microbatch, name), sorted by them: stashes, bytes and pages held.
  std::vector<stash::v1::LiveStashes> Rows() const;

 private:
  struct Held {
    uint32_t layer = 0;
    uint32_t microbatch = 0;
    std::string name;
    uint64_t bytes = 0;
    uint64_t pages = 0;
  };
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Held> by_ticket_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_LIVE_TAGS_H_

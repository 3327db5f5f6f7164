// Admission: every request is validated before it is queued or touches memory (DESIGN.md §7).
#ifndef STASH_DAEMON_ADMIT_H_
#define STASH_DAEMON_ADMIT_H_

#include <cstddef>
#include <cstdint>

#include "daemon/session.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// The most bytes of a name, label or tag a client may send (Stash.name, Hello.label,
// Hello.client_version): they are kept for the session's life and shown by stats.
inline constexpr size_t kMaxTextBytes = 256;

struct AdmitLimits {
  stash::v1::Backend backend = stash::v1::BACKEND_HOST;
  uint32_t max_inflight = 4096;     // queued requests per session
  uint64_t max_memories = 1 << 16;  // registered allocations per session
};

// Checks one post-Hello request against the session's registered memory and live tickets.
// On OK, records its effect on that receive-side state (memory declared or forgotten, ticket
// live, or claimed by a reload or release: the pool worker forgets it once it took the pages,
// or makes it live again when that request failed) so the next request is checked against it;
// on error nothing changes. Codes:
// INVALID_ARGUMENT (malformed or out of range), NOT_FOUND (unknown memory or ticket),
// ALREADY_EXISTS (reused id or ticket), RESOURCE_EXHAUSTED (too many in flight or registered),
// FAILED_PRECONDITION (a second Hello, or memory of the other backend). Messages say what to
// change.
Status AdmitRequest(const stash::v1::SessionRequest& request, Session& session,
                    const AdmitLimits& limits);

// Checks a Hello: backend must be known and match, device must name one of `pools` pools, label
// and client_version at most kMaxTextBytes.
Status CheckHello(const stash::v1::Hello& hello, stash::v1::Backend backend, int pools);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_ADMIT_H_

// Admission: every request is validated before it is queued or touches memory (docs/design.md).
#ifndef STASH_DAEMON_ADMIT_H_
#define STASH_DAEMON_ADMIT_H_

#include <cstddef>
#include <cstdint>

#include "daemon/sessions/session.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// The most bytes of a name, label or tag a client may send (Stash.name, Hello.label,
// Hello.client_version): they are kept for the session's life and shown by stats.
inline constexpr size_t kMaxTextBytes = 256;

struct AdmitLimits {
  stash::v1::Backend backend = stash::v1::BACKEND_HOST;
  uint32_t max_inflight = 4096;  // queued requests per session
  // Registered allocations per session. Each is one mapping of the daemon: together (over every
  // session, Session::budgets().memories) they stay well under vm.max_map_count, past which
  // every mmap of the daemon fails (and with it every other session's registrations).
  uint64_t max_memories = 4096;
  // Bytes of one registration (each is mapped into the daemon's address space, and a sparse
  // memfd costs its sender nothing; all of them together: Session::budgets().bytes).
  // MEMORY_KIND_HOST_FD memory on the cuda backend holds only event counters and counts, so it
  // gets `max_counter_memory_bytes`.
  uint64_t max_memory_bytes = 1ULL << 40;
  uint64_t max_counter_memory_bytes = 64ULL << 20;
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

// Gives back to the session's shared budgets what declaring `count` registrations of `bytes`
// in all took (an unregistration, a registration that failed, the session's end).
void GiveDeclared(Session& session, uint64_t bytes, uint64_t count = 1);

// Checks a Hello: backend must be known and match, device must name one of `pools` pools unless
// a cuda Hello names its GPU by UUID (the pool is then picked by UUID and the index is the
// client's own CUDA ordinal, which may be past the daemon's pool count), label and
// client_version at most kMaxTextBytes, group and group_secret of the shape CheckGroupFields
// (daemon/sessions/group_registry.h) takes.
Status CheckHello(const stash::v1::Hello& hello, stash::v1::Backend backend, int pools);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_ADMIT_H_

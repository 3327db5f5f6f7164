// The group a session joins (Options.group, Options.group_secret), or, with neither set, the one
// the environment names ($STASHD_GROUP, $STASHD_GROUP_SECRET): resolved once at Client::Open, so
// every reconnect of the session says the same Hello.
#ifndef STASH_CLIENT_GROUP_OPTIONS_H_
#define STASH_CLIENT_GROUP_OPTIONS_H_

#include <cstddef>

#include "stash/options.h"
#include "stash/status.h"

namespace stash::client {

// The bytes of a group secret (Hello.group_secret).
inline constexpr size_t kGroupSecretBytes = 32;

// `options` with its group fields resolved: as given when either is set, else from
// $STASHD_GROUP and $STASHD_GROUP_SECRET (64 hex characters, either case). INVALID_ARGUMENT,
// naming the option or the variable: a secret that is not 64 hex characters in the environment
// or not 32 bytes in Options, a group without a secret, a secret without a group. The group
// name's own shape is the daemon's to check (Hello.group). Messages never quote a secret.
StatusOr<Options> ResolveGroup(const Options& options);

}  // namespace stash::client

#endif  // STASH_CLIENT_GROUP_OPTIONS_H_

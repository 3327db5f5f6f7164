// The checks of a caller's arguments that every mode makes the same way, so each mode's session
// (client/copy, client/mapped, client/mapped/cuda) answers bad input with the same words.
#ifndef STASH_CLIENT_ARGUMENT_CHECKS_H_
#define STASH_CLIENT_ARGUMENT_CHECKS_H_

#include <cstdint>
#include <string>

#include "stash/client.h"

namespace stash::client {

// INVALID_ARGUMENT unless the stash's shape is usable: row_bytes > 0, max_rows > 0, and their
// product fits 64 bits.
Status CheckStashShape(const StashArgs& args);

// INVALID_ARGUMENT unless the reload names a ticket.
Status CheckReloadTicket(const ReloadArgs& args);

// INVALID_ARGUMENT unless `e` (when set) is an 8-byte aligned counter inside its buffer.
Status CheckEventPoint(const EventPoint& e, const char* what);

// INVALID_ARGUMENT unless [offset, offset + bytes) lies inside `buffer`; `what` names the range.
Status CheckHostRange(const HostBuffer& buffer, uint64_t offset, uint64_t bytes,
                      const std::string& what);

// INVALID_ARGUMENT when `stream` is set: only mapped mode on the cuda backend enqueues on one;
// `what` names the argument ("stash stream").
Status CheckNoStream(const void* stream, const char* what);

// FAILED_PRECONDITION: GraphsDestroyed in a mode that pages nothing inside CUDA graphs.
Status NoGraphsKept();

}  // namespace stash::client

#endif  // STASH_CLIENT_ARGUMENT_CHECKS_H_

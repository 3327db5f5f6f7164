// Syscalls go through one family of helpers (NCCL checks.h style): the expression text, the
// errno string, and EINTR retried.
#ifndef STASH_COMMON_SYS_H_
#define STASH_COMMON_SYS_H_

#include <cerrno>
#include <cstdint>
#include <string>

#include "stash/status.h"

namespace stash {

// A Status for the current errno: "<what>: <strerror> (errno N)", with a code that fits it
// (ENOENT -> NOT_FOUND, EACCES/EPERM -> PERMISSION_DENIED, ENOMEM/ENOSPC -> RESOURCE_EXHAUSTED,
// EINVAL -> INVALID_ARGUMENT, else INTERNAL).
Status ErrnoStatus(const std::string& what, int err = errno);

// This process's soft limit of open files (RLIMIT_NOFILE) as it is now; 16384 when it is
// unlimited or cannot be read. Daemon-wide descriptor budgets are shares of it.
uint64_t OpenFileLimit();

}  // namespace stash

// Evaluates `expr` (a syscall returning -1 on error) until it does not fail with EINTR; stores the
// result in `result`.
#define STASH_SYSCALL_RETRY(result, expr) \
  do {                                    \
    (result) = (expr);                    \
  } while ((result) == -1 && errno == EINTR)

// Runs a syscall (retrying EINTR); on -1 returns ErrnoStatus("<expr text>") from the enclosing
// function.
#define STASH_SYSCALL(expr)                                      \
  do {                                                           \
    long stash_sys_rc_;                                          \
    STASH_SYSCALL_RETRY(stash_sys_rc_, static_cast<long>(expr)); \
    if (stash_sys_rc_ == -1) return ::stash::ErrnoStatus(#expr); \
  } while (false)

#endif  // STASH_COMMON_SYS_H_

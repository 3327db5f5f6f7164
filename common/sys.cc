#include "common/sys.h"

#include <sys/resource.h>

#include <cstring>

namespace stash {

Status ErrnoStatus(const std::string& what, int err) {
  std::string message = what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
  switch (err) {
    case ENOENT:
      return NotFoundError(std::move(message));
    case EACCES:
    case EPERM:
      return PermissionDeniedError(std::move(message));
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return ResourceExhaustedError(std::move(message));
    case EINVAL:
      return InvalidArgumentError(std::move(message));
    case EEXIST:
      return AlreadyExistsError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

uint64_t OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 16384;
  return limit.rlim_cur;
}

}  // namespace stash

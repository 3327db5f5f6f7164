#include "client/session/argument_checks.h"

namespace stash::client {

Status CheckStashShape(const StashArgs& args) {
  if (args.row_bytes == 0 || args.max_rows == 0) {
    return InvalidArgumentError("stash needs row_bytes > 0 and max_rows > 0");
  }
  if (args.max_rows > UINT64_MAX / args.row_bytes) {
    return InvalidArgumentError("stash max_rows * row_bytes overflows 64 bits");
  }
  return Status::Ok();
}

Status CheckReloadTicket(const ReloadArgs& args) {
  if (args.ticket == 0) return InvalidArgumentError("reload needs the ticket Stash returned");
  return Status::Ok();
}

Status CheckHostRange(const HostBuffer& buffer, uint64_t offset, uint64_t bytes,
                      const std::string& what) {
  if (offset <= buffer.size() && bytes <= buffer.size() - offset) return Status::Ok();
  return InvalidArgumentError(what + " [offset, offset + " + std::to_string(bytes) +
                              ") runs past the end of its buffer (" +
                              std::to_string(buffer.size()) + " bytes)");
}

Status CheckEventPoint(const EventPoint& e, const char* what) {
  if (e.buffer == nullptr) return Status::Ok();
  if (e.offset % 8 != 0 || e.offset + 8 > e.buffer->size()) {
    return InvalidArgumentError(std::string(what) + " offset " + std::to_string(e.offset) +
                                " must be 8-byte aligned and inside its buffer (" +
                                std::to_string(e.buffer->size()) + " bytes)");
  }
  return Status::Ok();
}

Status CheckNoStream(const void* stream, const char* what) {
  if (stream == nullptr) return Status::Ok();
  return InvalidArgumentError(std::string(what) +
                              " is set, which only mapped mode on the cuda backend enqueues on; "
                              "this session orders its copies with ready / done events");
}

Status NoGraphsKept() {
  return FailedPreconditionError(
      "GraphsDestroyed: only mapped mode on the cuda backend pages inside CUDA graphs; this "
      "session keeps nothing for graphs");
}

}  // namespace stash::client

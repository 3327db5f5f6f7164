#include "daemon/copy/copy_state.h"

#include <string>

namespace stash::daemon {

StatusOr<uint8_t*> CopyState::Resolve(const stash::v1::MemoryRef& ref) const {
  auto it = memories.find(ref.memory_id());
  if (it == memories.end()) {
    return NotFoundError("memory " + std::to_string(ref.memory_id()) +
                         " is not registered in this session");
  }
  const ClientMemory& m = it->second;
  if (m.mapping == nullptr) {
    return FailedPreconditionError("memory " + std::to_string(ref.memory_id()) +
                                   " could not be opened: " + m.open_status.message());
  }
  return m.mapping->data() + ref.offset();
}

const uint64_t* CopyState::HostCounter(const stash::v1::MemoryRef& ref) const {
  auto it = memories.find(ref.memory_id());
  if (it == memories.end() || it->second.mapping == nullptr) return nullptr;
  const uint8_t* host = it->second.mapping->host();
  if (host == nullptr) return nullptr;
  return reinterpret_cast<const uint64_t*>(host + ref.offset());
}

}  // namespace stash::daemon

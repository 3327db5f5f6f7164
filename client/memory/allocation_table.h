// The cuda backend's table of the cudaMalloc allocations a client registered with the daemon,
// by base address. Kept apart from the driver calls (cuda_memory.cc) so that its rules run in
// the tests on any machine: a known allocation is found again (one IPC export, one registration
// per allocation), and an allocation that shows up where registered ones were means those were
// freed, so they must be unregistered (the daemon must not keep freed memory open).
// Not thread-safe: CudaSide locks around it.
#ifndef STASH_CLIENT_ALLOCATION_TABLE_H_
#define STASH_CLIENT_ALLOCATION_TABLE_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace stash::client {

class AllocationTable {
 public:
  struct Entry {
    uint64_t memory_id = 0;  // the session's id of the allocation
    uint64_t buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation in a process
    uint64_t bytes = 0;
    std::string handle;  // the IPC handle of the base
  };

  // The known allocation holding `address` with `buffer_id` (unique per allocation in a
  // process), with its base in `*base`; null when we do not know it (never seen, or another
  // allocation had that address before). Saves the driver a lookup on every stash.
  const Entry* FindContaining(uint64_t address, uint64_t buffer_id, uint64_t* base) const {
    auto it = entries_.upper_bound(address);
    if (it == entries_.begin()) return nullptr;
    --it;
    if (address - it->first >= it->second.bytes || it->second.buffer_id != buffer_id) {
      return nullptr;
    }
    *base = it->first;
    return &it->second;
  }

  // Adds the allocation at `base`. Entries whose ranges it overlaps were freed since: they are
  // removed and their memory ids returned, for the caller to unregister.
  std::vector<uint64_t> Insert(uint64_t base, Entry entry) {
    std::vector<uint64_t> stale;
    auto it = entries_.lower_bound(base);
    if (it != entries_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > base) --it;
    while (it != entries_.end() && it->first < base + entry.bytes) {
      stale.push_back(it->second.memory_id);
      it = entries_.erase(it);
    }
    entries_.emplace(base, std::move(entry));
    return stale;
  }

  // Removes the allocation holding `address`; returns its memory id, 0 when none holds it.
  uint64_t Remove(uint64_t address) {
    auto it = entries_.upper_bound(address);
    if (it == entries_.begin()) return 0;
    --it;
    if (address - it->first >= it->second.bytes) return 0;
    const uint64_t id = it->second.memory_id;
    entries_.erase(it);
    return id;
  }

  // Removes every allocation; returns their memory ids.
  std::vector<uint64_t> Clear() {
    std::vector<uint64_t> ids;
    ids.reserve(entries_.size());
    for (const auto& [base, entry] : entries_) ids.push_back(entry.memory_id);
    entries_.clear();
    return ids;
  }

  size_t size() const { return entries_.size(); }

 private:
  std::map<uint64_t, Entry> entries_;  // by base address; ranges never overlap
};

}  // namespace stash::client

#endif  // STASH_CLIENT_ALLOCATION_TABLE_H_

// First-fit allocation of ranges in [0, capacity): the page-record arenas of the CUDA executor
// and of a mapped rank's stream copier (each stash reserves room for its largest possible page
// record; the executor gives back what its plan did not use).
// Free ranges are coalesced. Not thread-safe (its owner serialises).
#ifndef STASH_COMMON_RANGE_ALLOCATOR_H_
#define STASH_COMMON_RANGE_ALLOCATOR_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace stash {

class RangeAllocator {
 public:
  explicit RangeAllocator(uint64_t capacity) : capacity_(capacity), free_total_(capacity) {
    if (capacity > 0) free_[0] = capacity;
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t free() const { return free_total_; }

  // The offset of `length` (> 0) free units, or nullopt when no free range is that long.
  std::optional<uint64_t> Allocate(uint64_t length) {
    if (length == 0) return std::nullopt;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < length) continue;
      const uint64_t offset = it->first;
      const uint64_t rest = it->second - length;
      free_.erase(it);
      if (rest > 0) free_[offset + length] = rest;
      free_total_ -= length;
      return offset;
    }
    return std::nullopt;
  }

  // Returns [offset, offset + length), which must be allocated.
  void Free(uint64_t offset, uint64_t length) {
    if (length == 0) return;
    free_total_ += length;
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + length) {
      length += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += length;
        return;
      }
    }
    free_[offset] = length;
  }

 private:
  const uint64_t capacity_;
  uint64_t free_total_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint and never adjacent
};

}  // namespace stash

#endif  // STASH_COMMON_RANGE_ALLOCATOR_H_

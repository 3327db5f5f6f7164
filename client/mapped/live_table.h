// The rank's side of its control block's live-stash table (stash/kernels/lease_live_table.h):
// an entry per live stash with its tags, written when the stash takes data and cleared when it
// is reloaded or released, so the daemon can show a mapped rank's stashes by (layer,
// microbatch, name).
//
// The writer keeps its own copy of every entry: stashes made before the daemon's block is
// mapped are written into it when it arrives, and a block mapped again (the daemon resends it
// until the rank says it attached) gets every live entry again.
//
// Thread-compatible: owned by the copier thread, with the lease table that maps the block.
// (The GPU twin's side is LiveTagWriter, below.)
#ifndef STASH_CLIENT_LIVE_TABLE_H_
#define STASH_CLIENT_LIVE_TABLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stash/kernels/lease_live_table.h"

namespace stash::client {

class LiveTableWriter {
 public:
  LiveTableWriter();

  // `block` is the control block's mapping of `bytes` (the table starts kLiveTableOffset in);
  // every live entry is written there. A block too small for a table leaves the writer
  // without one (the daemon then counts every stash as untagged).
  void Attach(uint8_t* block, uint64_t bytes);
  // Records a stash that took data; returns its entry, or -1 when every entry is taken (the
  // daemon counts the stash as untagged).
  int32_t Add(uint64_t ticket, uint32_t layer, uint32_t microbatch, std::string_view name,
              uint64_t bytes, uint64_t pages);
  // Clears an entry Add returned (-1: nothing). Each entry is its stash's until then.
  void Remove(int32_t entry);

 private:
  void Publish(uint32_t entry);

  kernels::LiveTable* table_ = nullptr;  // in the mapped block; null before one is attached
  std::vector<kernels::LiveEntry> own_;  // every entry as the table should hold it
  std::vector<int32_t> free_;            // entries free, the next one last
};

// The GPU twin's side of the table (StreamCopier): the host knows a stash's tags when it
// enqueues it, the stream's kernels know whether it took pages and how many when they run. So
// this writes an entry's tags and name, and the kernels its ticket, bytes and pages
// (kernels::WriteLiveEntry: set by the stash's publish, cleared by its reload's or release's).
// Entry i belongs to the stash in plan slot i (slots past the table count as untagged), so an
// entry is free exactly when its slot is, and a captured stash keeps its entry with its slot.
// The host rewrites the tags of a reused slot's entry at once, while the stream may not have
// reached the reload of the entry's previous stash yet: `stashctl sessions --detail` can show
// that stash under the new tags for as long (no number is wrong, only the row).
//
// Thread-compatible: owned by the StreamCopier.
class LiveTagWriter {
 public:
  LiveTagWriter();

  // As LiveTableWriter::Attach: every entry's tags are written there; a block too small for a
  // table leaves the writer without one. Returns whether the block holds a table (at
  // kernels::kLiveTableOffset), where the GPU's kernels then write the numbers.
  bool Attach(uint8_t* block, uint64_t bytes);
  // The tags of `entry` (< kernels::kLiveEntries) for the stash about to be enqueued in it.
  void Tag(uint32_t entry, uint32_t layer, uint32_t microbatch, std::string_view name);

 private:
  kernels::LiveTable* table_ = nullptr;
  std::vector<kernels::LiveEntry> own_;  // every entry's tags and name (numbers unused)
};

}  // namespace stash::client

#endif  // STASH_CLIENT_LIVE_TABLE_H_

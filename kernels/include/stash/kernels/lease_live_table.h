// The live-stash table of a mapped session's control block (docs/design.md, "Mapped mode").
//
// The memfd of a control block holds the SessionControl (lease_control.h) in its first page and
// this table after it: one entry per live stash with its ticket and tags (layer, microbatch,
// name), bytes and pages, so `stashctl sessions --detail` shows what a mapped rank holds by tag
// as it does for daemon-copy sessions. The rank's copier writes an entry when a stash takes data
// and clears it when the stash is reloaded or released; the daemon only reads.
//
// To the daemon every byte here is untrusted input: it reads at most kLiveEntries entries at
// fixed offsets, cuts each name to kLiveNameBytes, clamps each entry's numbers to what the
// session holds, and never indexes anything with a value read here. An entry is rewritten
// under its `seq` (odd while the rank writes): the daemon skips an entry whose seq was odd or
// moved while it read, and counts the stashes it could not place in a row as untagged.
#ifndef STASH_KERNELS_LEASE_LIVE_TABLE_H_
#define STASH_KERNELS_LEASE_LIVE_TABLE_H_

#include <cstdint>

#include "stash/kernels/lease_control.h"

namespace stash::kernels {

// "tashlive" in ASCII: written by a rank that keeps the table (one that does not leaves it 0,
// and all its live stashes show as untagged).
inline constexpr uint64_t kLiveTableMagic = 0x6576696c68736174ull;
// Where the table starts in the control block's memfd: the page after the SessionControl.
inline constexpr uint64_t kLiveTableOffset = 4096;
// Names longer than this are cut (at a UTF-8 character boundary by the rank).
inline constexpr uint64_t kLiveNameBytes = 80;
inline constexpr uint32_t kLiveEntries = 448;

struct LiveEntry {
  uint64_t seq;         // odd while the rank rewrites this entry
  uint64_t ticket;      // the stash's ticket; 0 = a free entry
  uint64_t tags;        // layer in the low 32 bits, microbatch in the high 32
  uint64_t bytes;       // payload bytes the stash holds
  uint64_t pages;       // pages it holds
  uint64_t name_bytes;  // <= kLiveNameBytes
  uint64_t name[kLiveNameBytes / 8];
};
static_assert(sizeof(LiveEntry) == 128, "LiveEntry is shared across processes");

struct LiveTable {
  uint64_t magic;  // kLiveTableMagic, written by the rank
  uint64_t reserved[7];
  LiveEntry entries[kLiveEntries];
};
static_assert(kLiveTableOffset >= sizeof(SessionControl), "the table follows the SessionControl");
static_assert(kLiveTableOffset + sizeof(LiveTable) <= kControlBlockBytes,
              "the table fits the control block");

}  // namespace stash::kernels

#endif  // STASH_KERNELS_LEASE_LIVE_TABLE_H_

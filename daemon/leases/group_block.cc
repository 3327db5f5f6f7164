#include "daemon/leases/group_block.h"

namespace stash::daemon {

namespace k = stash::kernels;

Status GroupBlock::CheckTiers(const std::vector<TierShape>& tiers) {
  if (tiers.size() > k::kMaxGroupTiers) {
    return FailedPreconditionError("a group depot describes at most " +
                                   std::to_string(k::kMaxGroupTiers) + " tiers; this daemon has " +
                                   std::to_string(tiers.size()));
  }
  return Status::Ok();
}

GroupBlock::GroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers)
    : chunk_pages_(chunk_pages) {
  for (const TierShape& t : tiers) {
    first_chunk_.push_back(chunks_);
    chunks_ += t.chunks;
  }
  pages_ = chunks_ * chunk_pages_;
  layout_ = k::GroupLayoutFor(pages_, chunks_);
}

k::GroupHeader GroupBlock::HeaderFor(uint64_t page_bytes,
                                     const std::vector<TierShape>& tiers) const {
  k::GroupHeader h{};
  h.magic = k::kGroupMagic;
  h.version = k::kGroupVersion;
  h.page_bytes = page_bytes;
  h.chunk_pages = chunk_pages_;
  h.tiers = tiers.size();
  h.pages = pages_;
  h.chunks = chunks_;
  h.chunk_free_offset = layout_.chunk_free_offset;
  h.chunk_state_offset = layout_.chunk_state_offset;
  h.tags_offset = layout_.tags_offset;
  h.block_bytes = layout_.block_bytes;
  for (size_t t = 0; t < tiers.size(); ++t) {
    h.tier[t] = k::GroupTier{first_chunk_[t], tiers[t].chunks, tiers[t].pages, tiers[t].pool};
  }
  return h;
}

}  // namespace stash::daemon

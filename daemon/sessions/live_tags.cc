#include "daemon/sessions/live_tags.h"

#include <map>
#include <tuple>

namespace stash::daemon {

void LiveTags::Add(uint64_t ticket, uint32_t layer, uint32_t microbatch, const std::string& name,
                   uint64_t bytes, uint64_t pages) {
  MutexLock lock(&mu_);
  by_ticket_[ticket] = Held{layer, microbatch, name, bytes, pages};
}

void LiveTags::Remove(uint64_t ticket) {
  MutexLock lock(&mu_);
  by_ticket_.erase(ticket);
}

void LiveTags::Clear() {
  MutexLock lock(&mu_);
  by_ticket_.clear();
}

std::vector<stash::v1::LiveStashes> LiveTags::Rows() const {
  std::map<std::tuple<uint32_t, uint32_t, std::string>, stash::v1::LiveStashes> rows;
  {
    MutexLock lock(&mu_);
    for (const auto& [ticket, held] : by_ticket_) {
      stash::v1::LiveStashes& row = rows[{held.layer, held.microbatch, held.name}];
      row.set_layer(held.layer);
      row.set_microbatch(held.microbatch);
      row.set_name(held.name);
      row.set_stashes(row.stashes() + 1);
      row.set_bytes(row.bytes() + held.bytes);
      row.set_pages(row.pages() + held.pages);
    }
  }
  std::vector<stash::v1::LiveStashes> out;
  out.reserve(rows.size());
  for (auto& [key, row] : rows) out.push_back(std::move(row));
  return out;
}

}  // namespace stash::daemon

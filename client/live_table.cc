#include "client/live_table.h"

#include <algorithm>
#include <cstring>

namespace stash {

namespace k = stash::kernels;

namespace {

// Bytes of `name` that fit an entry, cut where a UTF-8 character starts.
size_t NameBytes(const std::string& name) {
  size_t n = std::min<size_t>(name.size(), k::kLiveNameBytes);
  if (n == name.size()) return n;
  while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xc0) == 0x80) --n;
  return n;
}

}  // namespace

LiveTableWriter::LiveTableWriter() : own_(k::kLiveEntries) {
  for (k::LiveEntry& e : own_) std::memset(&e, 0, sizeof(e));
  for (int32_t i = static_cast<int32_t>(k::kLiveEntries) - 1; i >= 0; --i) free_.push_back(i);
}

void LiveTableWriter::Attach(uint8_t* block, uint64_t bytes) {
  table_ = nullptr;
  if (block == nullptr || bytes < k::kLiveTableOffset + sizeof(k::LiveTable)) return;
  table_ = reinterpret_cast<k::LiveTable*>(block + k::kLiveTableOffset);
  for (uint32_t i = 0; i < k::kLiveEntries; ++i) {
    if (own_[i].ticket != 0) Publish(i);
  }
  k::ControlStore(table_->magic, k::kLiveTableMagic);
}

int32_t LiveTableWriter::Add(uint64_t ticket, uint32_t layer, uint32_t microbatch,
                             const std::string& name, uint64_t bytes, uint64_t pages) {
  if (free_.empty() || ticket == 0) return -1;
  const int32_t entry = free_.back();
  free_.pop_back();
  k::LiveEntry& e = own_[static_cast<size_t>(entry)];
  e.ticket = ticket;
  e.tags = static_cast<uint64_t>(layer) | static_cast<uint64_t>(microbatch) << 32;
  e.bytes = bytes;
  e.pages = pages;
  e.name_bytes = NameBytes(name);
  std::memset(e.name, 0, sizeof(e.name));
  std::memcpy(e.name, name.data(), e.name_bytes);
  Publish(static_cast<uint32_t>(entry));
  return entry;
}

void LiveTableWriter::Remove(int32_t entry) {
  if (entry < 0 || entry >= static_cast<int32_t>(k::kLiveEntries)) return;
  k::LiveEntry& e = own_[static_cast<size_t>(entry)];
  if (e.ticket == 0) return;
  e.ticket = 0;
  Publish(static_cast<uint32_t>(entry));
  free_.push_back(entry);
}

// The entry is rewritten between an odd and the next even `seq`: a reader that sees the same
// even seq before and after its reads read a whole entry. Each field is a release store, so
// the odd seq is visible before any of them (no fences: ThreadSanitizer checks these).
void LiveTableWriter::Publish(uint32_t entry) {
  if (table_ == nullptr) return;
  const k::LiveEntry& from = own_[entry];
  k::LiveEntry& to = table_->entries[entry];
  const uint64_t odd = k::ControlLoad(to.seq) | 1;
  k::ControlStore(to.seq, odd);
  auto put = [](uint64_t& field, uint64_t value) {
    __atomic_store_n(&field, value, __ATOMIC_RELEASE);
  };
  put(to.ticket, from.ticket);
  put(to.tags, from.tags);
  put(to.bytes, from.bytes);
  put(to.pages, from.pages);
  put(to.name_bytes, from.name_bytes);
  for (size_t w = 0; w < k::kLiveNameBytes / 8; ++w) put(to.name[w], from.name[w]);
  put(to.seq, odd + 1);
}

}  // namespace stash

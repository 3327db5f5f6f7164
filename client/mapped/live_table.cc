#include "client/mapped/live_table.h"

#include <algorithm>
#include <cstring>

namespace stash::client {

namespace k = stash::kernels;

namespace {

// Bytes of `name` that fit an entry, cut where a UTF-8 character starts.
size_t NameBytes(std::string_view name) {
  size_t n = std::min<size_t>(name.size(), k::kLiveNameBytes);
  if (n == name.size()) return n;
  while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xc0) == 0x80) --n;
  return n;
}

void SetTags(k::LiveEntry& e, uint32_t layer, uint32_t microbatch, std::string_view name) {
  e.tags = static_cast<uint64_t>(layer) | static_cast<uint64_t>(microbatch) << 32;
  e.name_bytes = NameBytes(name);
  std::memset(e.name, 0, sizeof(e.name));
  std::memcpy(e.name, name.data(), e.name_bytes);
}

k::LiveTable* TableIn(uint8_t* block, uint64_t bytes) {
  if (block == nullptr || bytes < k::kLiveTableOffset + sizeof(k::LiveTable)) return nullptr;
  return reinterpret_cast<k::LiveTable*>(block + k::kLiveTableOffset);
}

// The entry is rewritten between an odd and the next even `seq`: a reader that sees the same
// even seq before and after its reads read a whole entry. Each field is a release store, so
// the odd seq is visible before any of them (no fences: ThreadSanitizer checks these).
// numbers = false: ticket, bytes and pages are left to the GPU's kernels (LiveTagWriter).
void PublishEntry(const k::LiveEntry& from, k::LiveEntry& to, bool numbers) {
  const uint64_t odd = k::ControlLoad(to.seq) | 1;
  k::ControlStore(to.seq, odd);
  auto put = [](uint64_t& field, uint64_t value) {
    __atomic_store_n(&field, value, __ATOMIC_RELEASE);
  };
  if (numbers) put(to.ticket, from.ticket);
  put(to.tags, from.tags);
  if (numbers) {
    put(to.bytes, from.bytes);
    put(to.pages, from.pages);
  }
  put(to.name_bytes, from.name_bytes);
  for (size_t w = 0; w < k::kLiveNameBytes / 8; ++w) put(to.name[w], from.name[w]);
  put(to.seq, odd + 1);
}

std::vector<k::LiveEntry> ZeroEntries() {
  std::vector<k::LiveEntry> entries(k::kLiveEntries);
  for (k::LiveEntry& e : entries) std::memset(&e, 0, sizeof(e));
  return entries;
}

}  // namespace

LiveTableWriter::LiveTableWriter() : own_(ZeroEntries()) {
  for (int32_t i = static_cast<int32_t>(k::kLiveEntries) - 1; i >= 0; --i) free_.push_back(i);
}

void LiveTableWriter::Attach(uint8_t* block, uint64_t bytes) {
  table_ = TableIn(block, bytes);
  if (table_ == nullptr) return;
  for (uint32_t i = 0; i < k::kLiveEntries; ++i) {
    if (own_[i].ticket != 0) Publish(i);
  }
  k::ControlStore(table_->magic, k::kLiveTableMagic);
}

int32_t LiveTableWriter::Add(uint64_t ticket, uint32_t layer, uint32_t microbatch,
                             std::string_view name, uint64_t bytes, uint64_t pages) {
  if (free_.empty() || ticket == 0) return -1;
  const int32_t entry = free_.back();
  free_.pop_back();
  k::LiveEntry& e = own_[static_cast<size_t>(entry)];
  e.ticket = ticket;
  e.bytes = bytes;
  e.pages = pages;
  SetTags(e, layer, microbatch, name);
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

void LiveTableWriter::Publish(uint32_t entry) {
  if (table_ != nullptr) PublishEntry(own_[entry], table_->entries[entry], true);
}

LiveTagWriter::LiveTagWriter() : own_(ZeroEntries()) {}

bool LiveTagWriter::Attach(uint8_t* block, uint64_t bytes) {
  table_ = TableIn(block, bytes);
  if (table_ == nullptr) return false;
  for (uint32_t i = 0; i < k::kLiveEntries; ++i) PublishEntry(own_[i], table_->entries[i], false);
  k::ControlStore(table_->magic, k::kLiveTableMagic);
  return true;
}

void LiveTagWriter::Tag(uint32_t entry, uint32_t layer, uint32_t microbatch,
                        std::string_view name) {
  if (entry >= k::kLiveEntries) return;
  SetTags(own_[entry], layer, microbatch, name);
  if (table_ != nullptr) PublishEntry(own_[entry], table_->entries[entry], false);
}

}  // namespace stash::client

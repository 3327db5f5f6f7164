#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

#include "common/macros.h"

namespace stash {
namespace {

void Fill(void* out, size_t bytes) {
  auto* p = static_cast<unsigned char*>(out);
  while (bytes > 0) {
    const ssize_t got = getrandom(p, bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    STASH_CHECK(got > 0) << "getrandom failed, errno " << errno;
    p += got;
    bytes -= static_cast<size_t>(got);
  }
}

}  // namespace

uint64_t RandomNonZeroU64() {
  uint64_t value = 0;
  while (value == 0) Fill(&value, sizeof(value));
  return value;
}

std::string RandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  Fill(out.data(), out.size());
  return out;
}

std::string RandomHex(size_t bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::vector<unsigned char> raw(bytes);
  Fill(raw.data(), raw.size());
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace stash

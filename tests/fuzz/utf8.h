// The fuzzers' own UTF-8 check: written here rather than taken from the code under test, so the
// oracle is independent of what it checks.
#ifndef STASH_TESTS_FUZZ_UTF8_H_
#define STASH_TESTS_FUZZ_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace stash::fuzz {

// Well-formed UTF-8 (RFC 3629): shortest form, no surrogates, at most U+10FFFF.
inline bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    constexpr uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kSmallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace stash::fuzz

#endif  // STASH_TESTS_FUZZ_UTF8_H_

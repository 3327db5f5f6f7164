#include "common/text.h"

#include <cstdio>

namespace stash {

std::string Hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string Dashed(std::string_view name) {
  std::string out(name);
  for (char& ch : out) {
    if (ch == '_') ch = '-';
  }
  return out;
}

std::string Wrap(std::string_view text, size_t width, const std::string& indent) {
  std::string out;
  std::string line;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(' ', i);
    if (j == std::string_view::npos) j = text.size();
    const std::string_view word = text.substr(i, j - i);
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
    i = j + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

}  // namespace stash

namespace stash {
namespace {

void AppendHexByte(uint8_t byte, std::string* out) {
  static const char* const kHex = "0123456789abcdef";
  *out += "\\x";
  *out += kHex[byte >> 4];
  *out += kHex[byte & 15];
}

}  // namespace

size_t Utf8CharLength(std::string_view bytes) {
  if (bytes.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint8_t low = 0x80;  // the second byte's range, narrowed for overlongs and surrogates
  uint8_t high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // overlong
    if (lead == 0xed) high = 0x9f;  // surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;   // overlong
    if (lead == 0xf4) high = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (bytes.size() < length) return 0;
  if (b(1) < low || b(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  }
  return length;
}

bool IsUtf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = Utf8CharLength(bytes.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Escaped(std::string_view bytes, size_t max_bytes) {
  std::string out;
  const std::string_view shown = bytes.substr(0, max_bytes);
  size_t i = 0;
  while (i < shown.size()) {
    const auto byte = static_cast<uint8_t>(shown[i]);
    const size_t n = Utf8CharLength(shown.substr(i));
    if (n == 0 || byte < 0x20 || byte == 0x7f || byte == '\\') {
      AppendHexByte(byte, &out);
      ++i;
      continue;
    }
    out.append(shown.substr(i, n));
    i += n;
  }
  if (shown.size() < bytes.size()) out += "...(" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

std::string ValidUtf8(std::string_view text) {
  if (IsUtf8(text)) return std::string(text);
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = Utf8CharLength(text.substr(i));
    if (n == 0) {
      AppendHexByte(static_cast<uint8_t>(text[i]), &out);
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace stash

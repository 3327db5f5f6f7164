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

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t continuation = 0;
    uint32_t code_point = 0;
    uint32_t smallest = 0;  // below it the encoding is overlong
    if ((lead & 0xe0) == 0xc0) {
      continuation = 1;
      code_point = lead & 0x1fu;
      smallest = 0x80;
    } else if ((lead & 0xf0) == 0xe0) {
      continuation = 2;
      code_point = lead & 0x0fu;
      smallest = 0x800;
    } else if ((lead & 0xf8) == 0xf0) {
      continuation = 3;
      code_point = lead & 0x07u;
      smallest = 0x10000;
    } else {
      return false;  // a continuation byte without a lead, or 0xf8..0xff
    }
    if (text.size() - i <= continuation) return false;  // cut short
    for (size_t k = 1; k <= continuation; ++k) {
      const auto byte = static_cast<unsigned char>(text[i + k]);
      if ((byte & 0xc0) != 0x80) return false;
      code_point = (code_point << 6) | (byte & 0x3fu);
    }
    if (code_point < smallest || code_point > 0x10ffff ||
        (code_point >= 0xd800 && code_point <= 0xdfff)) {
      return false;
    }
    i += continuation + 1;
  }
  return true;
}

}  // namespace stash

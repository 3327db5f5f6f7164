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

#include "common/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace stash {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Status BadSize(std::string_view text, const std::string& why) {
  return InvalidArgumentError("'" + std::string(text) + "' is not a size (" + why +
                              "): use a whole number of bytes with an optional unit B, KiB, "
                              "MiB, GiB, TiB (or KB, MB, GB, TB), e.g. 512MiB");
}

}  // namespace

StatusOr<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return BadSize(text, "empty");

  size_t i = 0;
  uint64_t whole = 0;
  bool any_digit = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    const auto digit = static_cast<uint64_t>(s[i] - '0');
    if (whole > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      return BadSize(text, "too large");
    }
    whole = whole * 10 + digit;
    any_digit = true;
    ++i;
  }
  // Optional fraction, kept as digits so "1.5GiB" is exact.
  uint64_t frac = 0;
  uint64_t frac_scale = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (frac_scale >= 1000000000000ULL) return BadSize(text, "too many decimals");
      frac = frac * 10 + static_cast<uint64_t>(s[i] - '0');
      frac_scale *= 10;
      any_digit = true;
      ++i;
    }
  }
  if (!any_digit) return BadSize(text, "no number");
  while (i < s.size() && s[i] == ' ') ++i;

  const std::string unit = Lower(s.substr(i));
  uint64_t mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kib") {
    mult = 1ULL << 10;
  } else if (unit == "m" || unit == "mib") {
    mult = 1ULL << 20;
  } else if (unit == "g" || unit == "gib") {
    mult = 1ULL << 30;
  } else if (unit == "t" || unit == "tib") {
    mult = 1ULL << 40;
  } else if (unit == "kb") {
    mult = 1000ULL;
  } else if (unit == "mb") {
    mult = 1000ULL * 1000;
  } else if (unit == "gb") {
    mult = 1000ULL * 1000 * 1000;
  } else if (unit == "tb") {
    mult = 1000ULL * 1000 * 1000 * 1000;
  } else {
    return BadSize(text, "unknown unit '" + std::string(s.substr(i)) + "'");
  }
  if (whole > std::numeric_limits<uint64_t>::max() / mult) return BadSize(text, "too large");
  const uint64_t base = whole * mult;
  // frac / frac_scale * mult must be a whole number of bytes.
  __extension__ using U128 = unsigned __int128;
  const U128 frac_bytes_scaled = static_cast<U128>(frac) * mult;
  if (frac_bytes_scaled % frac_scale != 0) return BadSize(text, "not a whole number of bytes");
  const auto extra = static_cast<uint64_t>(frac_bytes_scaled / frac_scale);
  if (base > std::numeric_limits<uint64_t>::max() - extra) return BadSize(text, "too large");
  return base + extra;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  auto value = static_cast<double>(bytes);
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", value);
  std::string text = buf;
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text + " " + kUnits[unit];
}

}  // namespace stash

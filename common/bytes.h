// Human sizes: "64GiB" <-> 68719476736.
#ifndef STASH_COMMON_BYTES_H_
#define STASH_COMMON_BYTES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "stash/status.h"

namespace stash {

// Parses a byte size: a non-negative integer with an optional unit, case-insensitive:
// B; KiB MiB GiB TiB (and the shorthands K M G T), powers of 1024; KB MB GB TB, powers of 1000.
// "1.5GiB" is accepted when the result is a whole number of bytes. INVALID_ARGUMENT otherwise,
// with a message that shows the accepted forms.
StatusOr<uint64_t> ParseBytes(std::string_view text);

// "0 B", "512 B", "256 KiB", "1.5 GiB": the largest binary unit with a value >= 1, at most
// two decimals, trailing zeros dropped.
std::string FormatBytes(uint64_t bytes);

}  // namespace stash

#endif  // STASH_COMMON_BYTES_H_

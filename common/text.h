// Small text helpers shared by the daemon and the CLI.
#ifndef STASH_COMMON_TEXT_H_
#define STASH_COMMON_TEXT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace stash {

// "0x00000000deadbeef": how tickets appear in messages.
std::string Hex(uint64_t value);

// A flag name as users type it: "pool_bytes" -> "pool-bytes".
std::string Dashed(std::string_view name);

// Wraps `text` at spaces into lines of at most `width` characters, each starting with `indent`
// and ending with a newline.
std::string Wrap(std::string_view text, size_t width, const std::string& indent);

// Whether `text` is well-formed UTF-8 (RFC 3629: shortest form, no surrogates, at most
// U+10FFFF), which protobuf requires of every `string` field it serializes.
bool IsValidUtf8(std::string_view text);

}  // namespace stash

#endif  // STASH_COMMON_TEXT_H_

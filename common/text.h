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

// Whether `bytes` is well-formed UTF-8 (shortest forms only, no surrogates, at most U+10FFFF),
// as proto3 requires of every `string` field.
bool IsUtf8(std::string_view bytes);

// The length of the well-formed UTF-8 character at the start of `bytes`; 0 when it is not one.
size_t Utf8CharLength(std::string_view bytes);

// Bytes a client sent, made fit for a response message or a log line: printable UTF-8 is kept;
// control characters, a backslash and every byte that is not valid UTF-8 become \xNN. At most
// `max_bytes` of the input are shown, then "...(N bytes)" says how long it was.
std::string Escaped(std::string_view bytes, size_t max_bytes = 64);

// `text` with each byte that is not part of well-formed UTF-8 written as \xNN: the last guard
// before a message built from anything a client sent goes out in a proto3 `string`.
std::string ValidUtf8(std::string_view text);

}  // namespace stash

#endif  // STASH_COMMON_TEXT_H_

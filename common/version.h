#ifndef STASH_COMMON_VERSION_H_
#define STASH_COMMON_VERSION_H_

namespace stash {

// The project version, from CMake's project(VERSION).
inline constexpr const char* kVersion = STASH_VERSION_STRING;

}  // namespace stash

#endif  // STASH_COMMON_VERSION_H_

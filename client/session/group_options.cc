#include "client/session/group_options.h"

#include <cstdlib>
#include <string>

namespace stash::client {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// 64 hex characters as 32 bytes, or INVALID_ARGUMENT naming $STASHD_GROUP_SECRET.
StatusOr<std::string> SecretFromHex(const std::string& hex) {
  const std::string rule = "$STASHD_GROUP_SECRET must be " + std::to_string(2 * kGroupSecretBytes) +
                           " hex characters (" + std::to_string(kGroupSecretBytes) +
                           " bytes, e.g. from 'openssl rand -hex 32', the same for every rank of "
                           "the job)";
  if (hex.size() != 2 * kGroupSecretBytes) {
    return InvalidArgumentError(rule + "; it has " + std::to_string(hex.size()) + " characters");
  }
  std::string secret(kGroupSecretBytes, '\0');
  for (size_t i = 0; i < kGroupSecretBytes; ++i) {
    const int high = HexDigit(hex[2 * i]);
    const int low = HexDigit(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return InvalidArgumentError(rule + "; character " +
                                  std::to_string(high < 0 ? 2 * i : 2 * i + 1) +
                                  " is not a hex digit");
    }
    secret[i] = static_cast<char>((high << 4) | low);
  }
  return secret;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

StatusOr<Options> ResolveGroup(const Options& options) {
  Options out = options;
  if (out.group.empty() && out.group_secret.empty()) {
    out.group = Env("STASHD_GROUP");
    const std::string hex = Env("STASHD_GROUP_SECRET");
    if (out.group.empty() && !hex.empty()) {
      return InvalidArgumentError(
          "$STASHD_GROUP_SECRET is set but $STASHD_GROUP is not: set both (the job's group name "
          "and its secret) or neither");
    }
    if (out.group.empty()) return out;
    if (hex.empty()) {
      return InvalidArgumentError(
          "$STASHD_GROUP is set but $STASHD_GROUP_SECRET is not: set both (the job's group name "
          "and its secret, 64 hex characters) or neither");
    }
    auto secret = SecretFromHex(hex);
    if (!secret.ok()) return secret.status();
    out.group_secret = std::move(secret).value();
    return out;
  }
  if (out.group.empty()) {
    return InvalidArgumentError(
        "Options.group_secret is set but Options.group is empty: name the group, or leave both "
        "empty for a session in no group");
  }
  if (out.group_secret.size() != kGroupSecretBytes) {
    return InvalidArgumentError(
        "Options.group_secret is " + std::to_string(out.group_secret.size()) +
        " bytes: a group's secret is exactly " + std::to_string(kGroupSecretBytes) +
        " bytes, the same for every session of the group" +
        (out.group_secret.empty() ? std::string(" (Options.group is set without one)") : ""));
  }
  return out;
}

}  // namespace stash::client

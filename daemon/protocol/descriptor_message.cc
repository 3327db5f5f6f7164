#include "daemon/protocol/descriptor_message.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "common/text.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

constexpr size_t kSessionIdChars = 32;
constexpr size_t kSecretBytes = 32;
constexpr size_t kMaxMessageBytes = 1024;

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// `text` cut to `limit` bytes at a character boundary, with every byte that does not start a
// well-formed UTF-8 character (protobuf refuses to parse anything else in a string) as '?'.
std::string SafeUtf8(const std::string& text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t len = Utf8CharLength(std::string_view(text).substr(i));
    if (out.size() + std::max<size_t>(len, 1) > limit) break;
    if (len == 0) {
      out += '?';
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace

StatusOr<v1::DescriptorRequest> ParseDescriptorRequest(const std::string& bytes,
                                                       size_t descriptors) {
  v1::DescriptorRequest request;
  if (!request.ParseFromString(bytes)) {
    return InvalidArgumentError(
        "the packet is not a stash.v1.DescriptorRequest (" + std::to_string(bytes.size()) +
        " bytes that do not parse): send one serialized DescriptorRequest per packet");
  }
  if (request.session_id().size() != kSessionIdChars || !IsHex(request.session_id())) {
    return InvalidArgumentError("session_id must be the " + std::to_string(kSessionIdChars) +
                                " lower-case hex characters of Welcome.session_id");
  }
  if (request.session_secret().size() != kSecretBytes) {
    return InvalidArgumentError("session_secret must be the " + std::to_string(kSecretBytes) +
                                " bytes of Welcome.descriptor_secret");
  }
  switch (request.kind_case()) {
    case v1::DescriptorRequest::kDepositMemory: {
      const v1::DepositMemory& d = request.deposit_memory();
      if (d.memory_id() == 0) return InvalidArgumentError("deposit_memory.memory_id must be > 0");
      if (d.bytes() == 0) return InvalidArgumentError("deposit_memory.bytes must be > 0");
      if (descriptors != 1) {
        return InvalidArgumentError(
            "deposit_memory carries exactly one descriptor (SCM_RIGHTS), "
            "this packet carried " +
            std::to_string(descriptors));
      }
      return request;
    }
    case v1::DescriptorRequest::kLeaseChunks: {
      const v1::LeaseChunks& l = request.lease_chunks();
      if (descriptors != 0) {
        return InvalidArgumentError("lease_chunks carries no descriptor; this packet carried " +
                                    std::to_string(descriptors));
      }
      if (l.automatic() && l.want_size() != 0) {
        return InvalidArgumentError("lease_chunks is either automatic or names `want`, not both");
      }
      bool seen[5] = {false, false, false, false, false};
      for (const v1::TierPages& w : l.want()) {
        const int t = static_cast<int>(w.tier());
        if (t != v1::TIER_DEVICE && t != v1::TIER_PEER && t != v1::TIER_HOST) {
          return InvalidArgumentError("lease_chunks.want names tier " + std::to_string(t) +
                                      ": a lease is of TIER_DEVICE, TIER_PEER or TIER_HOST");
        }
        if (seen[t]) {
          return InvalidArgumentError("lease_chunks.want names " + v1::Tier_Name(w.tier()) +
                                      " twice: name each tier at most once");
        }
        seen[t] = true;
      }
      return request;
    }
    case v1::DescriptorRequest::kReturnChunks: {
      const v1::ReturnChunks& r = request.return_chunks();
      if (descriptors != 0) {
        return InvalidArgumentError("return_chunks carries no descriptor; this packet carried " +
                                    std::to_string(descriptors));
      }
      if (r.chunk_ids_size() == 0 || static_cast<size_t>(r.chunk_ids_size()) > kMaxReturnChunkIds) {
        return InvalidArgumentError("return_chunks names " + std::to_string(r.chunk_ids_size()) +
                                    " chunk ids; name 1 to " + std::to_string(kMaxReturnChunkIds));
      }
      std::vector<uint64_t> ids(r.chunk_ids().begin(), r.chunk_ids().end());
      std::sort(ids.begin(), ids.end());
      if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
        return InvalidArgumentError("return_chunks names a chunk id twice: name each once");
      }
      return request;
    }
    case v1::DescriptorRequest::KIND_NOT_SET:
      break;
  }
  return InvalidArgumentError(
      "the request has no known kind: set deposit_memory, lease_chunks or return_chunks");
}

std::string DescriptorAnswer(const Status& status, uint64_t memory_id) {
  v1::DescriptorResponse response;
  response.set_memory_id(memory_id);
  return DescriptorAnswer(status, std::move(response));
}

std::string DescriptorAnswer(const Status& status, v1::DescriptorResponse response) {
  response.set_code(static_cast<int>(status.code()));
  response.set_message(SafeUtf8(status.message(), kMaxMessageBytes));
  return response.SerializeAsString();
}

}  // namespace stash::daemon

#include "daemon/protocol/wire.h"

#include <google/protobuf/descriptor.h>

#include <cstdint>
#include <string>

#include "common/text.h"

namespace stash::daemon {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Walks the wire format of one message (guided by its descriptor where fields are known) and
// reports the first problem; the bytes are never quoted, only offsets and field names.
class WireCheck {
 public:
  explicit WireCheck(std::string_view bytes) : bytes_(bytes) {}

  // Checks [pos_, end) as a message of type `d` (null: unknown, e.g. inside an unknown group).
  // `group` is the field number of the group being read (0: a length-delimited message or the
  // top level), which must end with its end-group tag.
  Status Message(const Descriptor* d, size_t end, int depth, uint32_t group) {
    while (pos_ < end) {
      const size_t tag_at = pos_;
      uint64_t varint = 0;
      if (!Varint(end, &varint)) return Bad(tag_at, "truncated: a field tag runs past the end");
      const auto tag = static_cast<uint32_t>(varint);  // as protobuf reads tags
      const uint32_t number = tag >> 3;
      const int wire_type = static_cast<int>(tag & 7);
      if (number == 0) return Bad(tag_at, "field number 0 does not exist");
      const FieldDescriptor* field =
          d != nullptr ? d->FindFieldByNumber(static_cast<int>(number)) : nullptr;
      const std::string name = FieldName(d, field, number);
      switch (wire_type) {
        case 0: {
          uint64_t ignored = 0;
          if (!Varint(end, &ignored))
            return Bad(tag_at, "truncated: " + name + " runs past the end");
          break;
        }
        case 1:
        case 5: {
          const size_t width = wire_type == 1 ? 8 : 4;
          if (end - pos_ < width) return Bad(tag_at, "truncated: " + name + " runs past the end");
          pos_ += width;
          break;
        }
        case 2: {
          uint64_t length = 0;
          if (!Varint(end, &length)) {
            return Bad(tag_at, "truncated: the length of " + name + " runs past the end");
          }
          if (length > end - pos_) {
            return Bad(tag_at, "truncated: " + name + " says " + std::to_string(length) +
                                   " bytes but only " + std::to_string(end - pos_) + " are left");
          }
          const size_t field_end = pos_ + static_cast<size_t>(length);
          if (field != nullptr && field->type() == FieldDescriptor::TYPE_STRING &&
              !IsUtf8(bytes_.substr(pos_, static_cast<size_t>(length)))) {
            return Bad(tag_at, name + " is not valid UTF-8 (a proto3 string): send UTF-8 text");
          }
          if (field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE) {
            if (depth + 1 > kMaxWireDepth) return TooDeep(tag_at);
            if (Status s = Message(field->message_type(), field_end, depth + 1, 0); !s.ok()) {
              return s;
            }
          }
          pos_ = field_end;
          break;
        }
        case 3: {
          if (depth + 1 > kMaxWireDepth) return TooDeep(tag_at);
          // A known field is never a group in proto3: read it as unknown.
          if (Status s = Message(nullptr, end, depth + 1, number); !s.ok()) {
            return s;
          }
          break;
        }
        case 4:
          if (group != number) {
            return Bad(tag_at, "an end-group tag for field " + std::to_string(number) +
                                   " closes no group that is open");
          }
          return Status::Ok();
        default:
          return Bad(tag_at, name + " has wire type " + std::to_string(wire_type) +
                                 ", which does not exist");
      }
    }
    if (group != 0) {
      return Bad(pos_, "truncated: the group of field " + std::to_string(group) + " never ends");
    }
    return Status::Ok();
  }

 private:
  bool Varint(size_t end, uint64_t* out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && pos_ < end; shift += 7) {
      const auto byte = static_cast<uint8_t>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *out = value;
        return true;
      }
    }
    return false;
  }

  static std::string FieldName(const Descriptor* d, const FieldDescriptor* field, uint32_t number) {
    if (field != nullptr) return "field " + field->full_name();
    if (d != nullptr) return "field " + std::to_string(number) + " of " + d->full_name();
    return "field " + std::to_string(number);
  }

  static Status Bad(size_t at, const std::string& what) {
    return InvalidArgumentError(what + " (at byte " + std::to_string(at) + ")");
  }
  static Status TooDeep(size_t at) {
    return Bad(at, "messages or groups are nested deeper than " + std::to_string(kMaxWireDepth) +
                       " levels");
  }

  const std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace

Status ParseMessage(std::string_view bytes, google::protobuf::Message* out) {
  out->Clear();
  const std::string type = out->GetDescriptor()->full_name();
  WireCheck check(bytes);
  // Checked first: protobuf's parser gives no reason, and logs one for bad UTF-8.
  if (Status s = check.Message(out->GetDescriptor(), bytes.size(), 0, 0); !s.ok()) {
    return InvalidArgumentError("not a valid " + type + ": " + s.message());
  }
  if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    out->Clear();
    return InvalidArgumentError("not a valid " + type + " (" + std::to_string(bytes.size()) +
                                " bytes that protobuf could not parse)");
  }
  return Status::Ok();
}

}  // namespace stash::daemon

// Names the valid values of a protocol enum, so an error about an unknown value can say what to
// send instead ("backend 99 is not a known Backend: use BACKEND_HOST or BACKEND_CUDA").
#ifndef STASH_DAEMON_ENUM_CHOICES_H_
#define STASH_DAEMON_ENUM_CHOICES_H_

#include <google/protobuf/generated_enum_reflection.h>

#include <string>

namespace stash::daemon {

// The names of E's values other than its zero (`*_UNSPECIFIED`) value, in declaration order,
// as "A", "A or B" or "A, B or C".
template <typename E>
std::string EnumChoices() {
  const google::protobuf::EnumDescriptor* d = google::protobuf::GetEnumDescriptor<E>();
  std::string out;
  int listed = 0;
  const int total = d->value_count() - (d->FindValueByNumber(0) != nullptr ? 1 : 0);
  for (int i = 0; i < d->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = d->value(i);
    if (v->number() == 0) continue;
    if (listed > 0) out += listed + 1 == total ? " or " : ", ";
    out += v->name();
    ++listed;
  }
  return out;
}

// "<what> <value> is not a known <Enum>: use <choices>", for a value that E does not define.
template <typename E>
std::string UnknownEnumValue(const std::string& what, int value) {
  return what + " " + std::to_string(value) + " is not a known " +
         google::protobuf::GetEnumDescriptor<E>()->name() + ": use " + EnumChoices<E>();
}

}  // namespace stash::daemon

#endif  // STASH_DAEMON_ENUM_CHOICES_H_

// Status plumbing and invariant checks shared by the daemon and the client library.
//
// Envoy's rule: whatever a client, a request or the environment can cause is a Status (plus a log
// line and a counter); an impossible internal state is STASH_CHECK(cond) << why, which aborts.
#ifndef STASH_COMMON_MACROS_H_
#define STASH_COMMON_MACROS_H_

#include <cstdlib>
#include <iostream>
#include <sstream>

#include "stash/status.h"

#define STASH_CONCAT_INNER_(a, b) a##b
#define STASH_CONCAT_(a, b) STASH_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define STASH_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::stash::Status stash_status_ = (expr);        \
    if (!stash_status_.ok()) return stash_status_; \
  } while (false)

// `lhs = value of StatusOr expr`, or return its Status from the enclosing function. `lhs` may be
// a declaration, so it cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define STASH_ASSIGN_OR_RETURN(lhs, expr) \
  STASH_ASSIGN_OR_RETURN_IMPL_(STASH_CONCAT_(stash_statusor_, __LINE__), lhs, expr)
#define STASH_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace stash::internal {

// Collects the streamed explanation of a failed STASH_CHECK, prints it and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* expr, const char* file, int line) {
    stream_ << "STASH_CHECK failed at " << file << ":" << line << ": " << expr << ": ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `STASH_CHECK(c) << x` be one expression of type void.
struct Voidify {
  void operator&(std::ostream& /*unused*/) {}
};

}  // namespace stash::internal

// Aborts with the expression, the place and the streamed reason when `cond` is false.
// The replacement cannot be parenthesized: `<< why` must bind to the failure's stream.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define STASH_CHECK(cond)                 \
  (cond) ? (void)0                        \
         : ::stash::internal::Voidify() & \
               ::stash::internal::CheckFailure(#cond, __FILE__, __LINE__).stream()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // STASH_COMMON_MACROS_H_

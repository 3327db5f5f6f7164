// The demo's launcher: forks the rank processes, prints their reports in (step, rank) order,
// and the summary and parity verdict.
#ifndef STASH_EXAMPLES_LAUNCHER_H_
#define STASH_EXAMPLES_LAUNCHER_H_

#include "examples/demo_flags.h"

namespace stash::demo {

// Forks flags.ranks children, each running RunRank, before this process makes any client or
// gRPC call (gRPC does not survive fork). Waits for all of them. Returns the exit code: 0 when
// every rank reported parity, 1 otherwise (after printing why: errors on stderr, once per
// distinct message, so "no daemon" is one line naming the socket).
int RunDemo(const DemoFlags& flags);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_LAUNCHER_H_

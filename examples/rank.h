// One training rank of the demo: its own stashd session, every step run twice (in-process
// reference, then stashed) and compared bit for bit.
#ifndef STASH_EXAMPLES_RANK_H_
#define STASH_EXAMPLES_RANK_H_

#include "examples/demo_flags.h"

namespace stash::demo {

// Runs rank `rank` of the demo in the calling process and reports over `report_fd` (report.h
// lines; the fd is not closed). With `hold_fd` >= 0 (flags.hold_command set), the rank reports a
// hold line once its last step's forward pass is done and reads one byte from `hold_fd` before
// the backward pass. Returns the process exit code: 0 when every step matched the reference, 1 on
// any error or mismatch (the reason was reported). Opens its own Client, so call it only in a
// process that has not forked since it touched gRPC (the launcher forks first).
int RunRank(const DemoFlags& flags, int rank, int report_fd, int hold_fd);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_RANK_H_

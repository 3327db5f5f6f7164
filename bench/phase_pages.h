// stash-bench's pages phase (docs/benchmarks.md §1, issue 24): the steady 256 MiB stash and
// reload with huge pages against 4 KiB pages, through the same daemon and worker, in the same
// run: shmem transparent huge pages where this node offers them to memfds, and hugetlb pages
// where its huge page pool has room; a row says so where it has neither.
#ifndef STASH_BENCH_PHASE_PAGES_H_
#define STASH_BENCH_PHASE_PAGES_H_

#include <vector>

#include "bench/harness.h"
#include "bench/report.h"
#include "stash/status.h"

namespace stash::bench {

Status PhasePages(Env& env, std::vector<Row>& rows);

}  // namespace stash::bench

#endif  // STASH_BENCH_PHASE_PAGES_H_

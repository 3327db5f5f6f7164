// A few threads that split one large copy (docs/design.md: "a few threads split large copies").
#ifndef STASH_COMMON_COPY_WORKERS_H_
#define STASH_COMMON_COPY_WORKERS_H_

#include <absl/base/thread_annotations.h>
#include "common/mutex.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

namespace stash {

// Thread-safe: several pool workers may call ParallelFor at once.
class CopyWorkers {
 public:
  // `threads` >= 1 counts the caller: threads - 1 helper threads are started.
  explicit CopyWorkers(uint32_t threads);
  CopyWorkers(const CopyWorkers&) = delete;
  CopyWorkers& operator=(const CopyWorkers&) = delete;
  ~CopyWorkers();

  uint32_t threads() const { return threads_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), split into at most threads()
  // parts of at least `min_part` items, the caller running one; returns when all are done.
  void ParallelFor(uint64_t n, uint64_t min_part,
                   const std::function<void(uint64_t begin, uint64_t end)>& fn);

 private:
  struct Job {
    const std::function<void(uint64_t, uint64_t)>* fn;
    uint64_t begin;
    uint64_t end;
    struct Latch* latch;
  };
  void Run();

  const uint32_t threads_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace stash

#endif  // STASH_COMMON_COPY_WORKERS_H_

#include "common/copy_workers.h"

namespace stash {

struct Latch {
  Mutex mu;
  CondVar cv;
  uint64_t left ABSL_GUARDED_BY(mu) = 0;
};

CopyWorkers::CopyWorkers(uint32_t threads) : threads_(threads == 0 ? 1 : threads) {
  for (uint32_t i = 1; i < threads_; ++i) helpers_.emplace_back([this] { Run(); });
}

CopyWorkers::~CopyWorkers() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : helpers_) t.join();
}

void CopyWorkers::Run() {
  while (true) {
    Job job{};
    {
      MutexLock lock(&mu_);
      while (jobs_.empty() && !stopping_) cv_.Wait(&mu_);
      if (jobs_.empty()) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    (*job.fn)(job.begin, job.end);
    MutexLock lock(&job.latch->mu);
    if (--job.latch->left == 0) job.latch->cv.Signal();
  }
}

void CopyWorkers::ParallelFor(uint64_t n, uint64_t min_part,
                              const std::function<void(uint64_t, uint64_t)>& fn) {
  if (n == 0) return;
  if (min_part == 0) min_part = 1;
  uint64_t parts = n / min_part;
  if (parts > threads_) parts = threads_;
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const uint64_t per = (n + parts - 1) / parts;
  parts = (n + per - 1) / per;  // every part non-empty
  Latch latch;
  {
    MutexLock lock(&latch.mu);
    latch.left = parts - 1;
  }
  {
    MutexLock lock(&mu_);
    for (uint64_t p = 1; p < parts; ++p) {
      const uint64_t begin = p * per;
      const uint64_t end = begin + per < n ? begin + per : n;
      jobs_.push_back(Job{&fn, begin, end, &latch});
    }
    cv_.SignalAll();
  }
  fn(0, per);
  MutexLock lock(&latch.mu);
  while (latch.left > 0) latch.cv.Wait(&latch.mu);
}

}  // namespace stash

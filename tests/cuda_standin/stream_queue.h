// TEST AID, NEVER A BACKEND (see standin.h). A stream's queue of work and its worker thread
// (streams.cc).
#ifndef STASH_TESTS_CUDA_STANDIN_STREAM_QUEUE_H_
#define STASH_TESTS_CUDA_STANDIN_STREAM_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "internal.h"

namespace standin {

using Clock = std::chrono::steady_clock;

// The in-order work of one stream, shared by its handle and its worker thread (which outlives a
// destroyed stream until the work is done: cuStreamDestroy "will return immediately and the
// resources associated with hStream will be released automatically once the device has
// completed all work in hStream").
class Queue {
 public:
  // A queue with its worker thread running.
  static std::shared_ptr<Queue> Start() {
    auto q = std::make_shared<Queue>();
    std::thread([q] { q->Run(); }).detach();
    return q;
  }

  void Push(Op op, Clock::duration delay) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(Item{std::move(op), Clock::now() + delay});
    ++enqueued_;
    cv_.notify_all();
  }

  // Runs `op` now on the calling thread, after everything queued (immediate mode).
  void RunNow(const Op& op) {
    std::lock_guard<std::mutex> run(run_mu_);
    WaitIdle();
    op();
  }

  // How many operations were ever enqueued: WaitFor(Enqueued()) waits for all of them.
  uint64_t Enqueued() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }

  // Waits until every operation enqueued before the call has run.
  void WaitIdle() { WaitFor(Enqueued()); }

  // Waits until the first `target` operations have run. A stream wait dies after the wait
  // timeout, so this ends; if it does not (no worker: a forked child using its parent's stream),
  // it dies rather than hang the test.
  void WaitFor(uint64_t target) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto limit = std::chrono::milliseconds(2 * config().wait_timeout_ms + 1000);
    if (!cv_.wait_for(lock, limit, [&] { return completed_ >= target; })) {
      Die("a stream did not finish its work within " + std::to_string(limit.count()) +
          " ms (a stream of the parent used in a forked child has no worker thread)");
    }
  }

  bool Idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ == enqueued_;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  struct Item {
    Op op;
    Clock::time_point due;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !items_.empty() || closed_; });
      if (items_.empty()) return;  // closed and drained
      const Clock::time_point due = items_.front().due;
      if (Clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;
      }
      Op op = std::move(items_.front().op);
      items_.pop_front();
      lock.unlock();
      {
        std::lock_guard<std::mutex> run(run_mu_);
        op();
      }
      lock.lock();
      ++completed_;
      cv_.notify_all();
    }
  }

  std::mutex run_mu_;  // one operation of this stream at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool closed_ = false;
};

}  // namespace standin

#endif  // STASH_TESTS_CUDA_STANDIN_STREAM_QUEUE_H_

// WriteQueue: in-order writes on a gRPC callback stream, from any thread.
//
// gRPC allows one StartWrite in flight per stream, and the message must stay untouched until its
// OnWriteDone. Callers on many threads Push; the queue keeps one message "on the wire" and
// starts the next from OnWriteDone. One more rule: the wire message is reused only after the
// thread that called StartWrite has returned from it. OnWriteDone may run on a gRPC thread before
// that, and the hand-off between the two happens inside gRPC, where ThreadSanitizer cannot see
// it (Debian's gRPC is not instrumented). Ordering every reuse through our own mutex makes it
// visible, and it costs nothing.
#ifndef STASH_COMMON_WRITE_QUEUE_H_
#define STASH_COMMON_WRITE_QUEUE_H_

#include <deque>
#include <functional>
#include <mutex>
#include <utility>

namespace stash {

template <typename Message>
class WriteQueue {
 public:
  // `start_write` issues the stream's StartWrite for the given message. `on_idle` (optional) runs
  // when a write completes and nothing else is queued; it must not call back into the queue.
  explicit WriteQueue(std::function<void(const Message*)> start_write,
                      std::function<void()> on_idle = nullptr)
      : start_write_(std::move(start_write)), on_idle_(std::move(on_idle)) {}

  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues `message`, and starts writing when nothing is in flight. Returns false (and drops the
  // message) once the queue is closed.
  bool Push(Message message) {
    bool kick = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      queue_.push_back(std::move(message));
      kick = AdvanceLocked();
    }
    if (kick) StartAndSettle();
    return true;
  }

  // Queues `batch` in order without starting a write, so a caller can queue under its own lock
  // and keep batches of different threads apart. Returns whether the caller must call Kick()
  // (after releasing its lock: never hold a lock across a gRPC write). False when closed.
  template <typename Batch>
  bool Enqueue(Batch& batch, bool* accepted) {
    std::lock_guard<std::mutex> lock(mu_);
    *accepted = !closed_;
    if (closed_) return false;
    for (auto& m : batch) queue_.push_back(std::move(m));
    return AdvanceLocked();
  }

  // Starts the write Enqueue asked for.
  void Kick() { StartAndSettle(); }

  // The stream's OnWriteDone. `ok` false drops everything queued and closes the queue.
  void OnWriteDone(bool ok) {
    bool idle = false;
    std::function<void()> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        closed_ = true;
        queue_.clear();
        last_ = nullptr;
      }
      in_flight_ = false;
      if (starting_) {
        completed_early_ = true;  // the starter picks up from here once StartWrite returns
        return;
      }
      if (!AdvanceLocked()) {
        idle = true;
        last.swap(last_);
      }
    }
    if (idle) {
      if (last) last();
      if (on_idle_) on_idle_();
      return;
    }
    StartAndSettle();
  }

  // Drops what is queued (not the write in flight) and refuses later Pushes.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    queue_.clear();
    last_ = nullptr;
  }

  // Refuses later Pushes; once everything queued is written, runs `last` once (a client's
  // StartWritesDone), on the thread that sees the queue drain. Returns false, and never runs
  // `last`, when the queue was closed already; `last` is dropped when a write fails.
  bool CloseAfterWrites(std::function<void()> last) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      closed_ = true;
      if (in_flight_ || starting_ || !queue_.empty()) {
        last_ = std::move(last);
        return true;
      }
    }
    last();
    return true;
  }

  // Whether a write is in flight or starting.
  bool busy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_ || starting_;
  }

 private:
  // Moves the next queued message onto the wire if the wire is free (lock held). True when the
  // caller must now call StartAndSettle.
  bool AdvanceLocked() {
    if (in_flight_ || starting_ || queue_.empty()) return false;
    wire_ = std::move(queue_.front());
    queue_.pop_front();
    in_flight_ = true;
    starting_ = true;
    return true;
  }

  // Starts the wire message; if its write completed before StartWrite returned, goes on with the
  // next one here.
  void StartAndSettle() {
    while (true) {
      start_write_(&wire_);
      bool idle = false;
      std::function<void()> last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        starting_ = false;
        if (!completed_early_) return;
        completed_early_ = false;
        if (!AdvanceLocked()) {
          idle = true;
          last.swap(last_);
        }
      }
      if (idle) {
        if (last) last();
        if (on_idle_) on_idle_();
        return;
      }
    }
  }

  const std::function<void(const Message*)> start_write_;
  const std::function<void()> on_idle_;
  mutable std::mutex mu_;
  std::deque<Message> queue_;     // guarded by mu_
  Message wire_;                  // the message being written; see the class comment
  bool in_flight_ = false;        // guarded by mu_: StartWrite issued, OnWriteDone not yet run
  bool starting_ = false;         // guarded by mu_: a thread is inside StartWrite
  bool completed_early_ = false;  // guarded by mu_: OnWriteDone ran while starting_
  bool closed_ = false;           // guarded by mu_
  std::function<void()> last_;    // guarded by mu_: CloseAfterWrites' action, until it runs
};

}  // namespace stash

#endif  // STASH_COMMON_WRITE_QUEUE_H_

// An ActivationStore that stashes every layer's input in stashd, the way a training rank does
// (docs/design.md): the stash is queued before the producer finishes, the row count travels by
// reference and is read by the daemon only after the ready event, the rank poisons its own copy
// once the daemon confirms, and backward reloads into a poisoned buffer with a zeroed tail. A
// stash that overflowed stays with the rank and backward uses the rank's own copy.
#ifndef STASH_EXAMPLES_DAEMON_STORE_H_
#define STASH_EXAMPLES_DAEMON_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/expert_stack.h"
#include "stash/client.h"

namespace stash::demo {

// How long the demo waits for any one answer of the daemon before it calls the daemon stuck
// (DEADLINE_EXCEEDED) instead of hanging: far above any copy the demo's shapes ask for.
constexpr int64_t kAnswerTimeoutMs = 60'000;

// Where one step's stashes went, from the daemon's completions.
struct StashTally {
  int device = 0;           // stashes in the rank's device pool
  int host = 0;             // stashes spilled: the host tier or a peer device's pool
  int overflow = 0;         // stashes the daemon could not take
  uint64_t bytes = 0;       // payload the daemon holds (rows * row_bytes, summed)
  uint64_t pages = 0;       // pages the daemon holds for them
  uint64_t kept_bytes = 0;  // activation bytes the rank kept because their stash overflowed
};

// What both stores (this one and the GPU rank's, cuda_trainer.h) share.
// `status` of operation `what` ("stash", "reload") of layer `layer`: "layer 3: stash: ...".
Status LayerError(int layer, const char* what, const Status& status);
// A layer input's stash: its shape and tags; the caller sets the source, count and events.
StashArgs LayerStashArgs(const StackShape& shape, int layer);
// Waits for a stash's answer and adds it to `tally` after checking its rows against what the
// producer published; `*tier` gets where it went. true: the daemon holds the rows and the rank
// may free its copy; false: OVERFLOW, keep it.
StatusOr<bool> AwaitStash(Client* client, const StackShape& shape, int layer, uint64_t ticket,
                          int64_t published_rows, StashTally* tally, Tier* tier);
// Checks a reload's answer against the stash it reloads.
Status CheckReload(int layer, const Completion& done, int64_t rows, Tier tier);

class DaemonStore final : public ActivationStore {
 public:
  // Allocates the rank's shared-memory buffers: one per layer input, one reload target and a
  // control block with a count slot and a ready counter per layer. `client` must outlive the
  // store.
  static StatusOr<std::unique_ptr<DaemonStore>> Create(Client* client, const StackShape& shape);

  // Starts a step: clears the tally and raises the value the ready events are signalled to.
  void BeginStep();
  const StashTally& tally() const { return tally_; }

  float* Input(int layer) override;
  Status WillProduce(int layer) override;
  Status Produced(int layer, int64_t rows) override;
  Status Consumed(int layer) override;
  StatusOr<const float*> Restore(int layer) override;

 private:
  struct Slot {
    uint64_t ticket = 0;
    int64_t rows = -1;  // what the producer wrote
    Tier tier = Tier::kUnspecified;
  };

  DaemonStore(Client* client, const StackShape& shape) : client_(client), shape_(shape) {}
  int64_t* CountSlot(int layer) const;
  EventPoint ReadyEvent(int layer) const;

  Client* const client_;  // not owned
  const StackShape shape_;
  std::vector<std::unique_ptr<HostBuffer>> inputs_;
  std::unique_ptr<HostBuffer> reload_;
  // Per layer l: the int64 row count at 16 * l, the ready counter at 16 * l + 8.
  std::unique_ptr<HostBuffer> control_;
  std::vector<Slot> slots_;
  uint64_t ready_value_ = 0;  // steps begun: counters only grow, so each step signals one higher
  StashTally tally_;
};

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_DAEMON_STORE_H_

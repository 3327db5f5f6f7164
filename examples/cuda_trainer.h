// The demo's GPU rank (--backend=cuda): the expert stack of expert_stack.h on one GPU with the
// CUDA grouped linear, every layer input stashed in stashd straight from device memory, the way
// a PyTorch rank does it:
//  - activations live in one cudaMalloc arena (like the caching allocator's segments), so the
//    library exports one IPC handle and the daemon opens it once;
//  - a stash is asked for once its producer and the ready event the trainer's stream raises
//    after it (EnqueueSignal) are queued, never before (a first, lazily loaded kernel launch
//    may synchronise the context); the row count lives in device memory (written -1 first,
//    then the real count by a kernel), and the daemon reads neither before the ready event;
//  - once the daemon confirms a copy the rank poisons its own buffer on the stream;
//  - backward reloads into a poisoned buffer (zero tail) behind a ready event raised after the
//    previous layer's kernels, and the stream waits on the reload's done event
//    (EnqueueWait) before the kernels that read it: the host never waits for a copy.
// Outputs and gradients come back to the host once per pass for the parity check.
#ifndef STASH_EXAMPLES_CUDA_TRAINER_H_
#define STASH_EXAMPLES_CUDA_TRAINER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "examples/daemon_store.h"
#include "examples/expert_stack.h"
#include "stash/client.h"

namespace stash::demo {

class CudaTrainer {
 public:
  // Makes `device` this thread's CUDA device, allocates the rank's GPU memory there and uploads
  // the weights. `client` (a cuda-backend session on that device) must outlive the trainer.
  static StatusOr<std::unique_ptr<CudaTrainer>> Create(
      Client* client, int device, const StackShape& shape,
      const std::vector<std::vector<float>>& weights);
  ~CudaTrainer();
  CudaTrainer(const CudaTrainer&) = delete;
  CudaTrainer& operator=(const CudaTrainer&) = delete;

  // Starts a step: clears the tally, raises the value this step's events are signalled to.
  void BeginStep();
  // Forward through every layer, stashing each input; fills out->output. Returns once every
  // stash is answered (the tally is complete).
  Status Forward(const StepInputs& inputs, StepOutputs* out);
  // Backward, last layer first, reloading each input; fills the gradients of `out`.
  Status Backward(const StepInputs& inputs, StepOutputs* out);
  const StashTally& tally() const { return tally_; }

 private:
  struct Slot {
    uint64_t ticket = 0;
    int64_t rows = -1;  // what the producer published
    Tier tier = Tier::kUnspecified;
    uint64_t reload = 0;  // the reload's operation id
  };
  // Event counters in `control_`, per layer: stash ready, reload ready, reload done.
  enum Counter : uint64_t { kStashReady = 0, kReloadReady = 1, kReloadDone = 2, kCounters = 3 };

  CudaTrainer(Client* client, const StackShape& shape) : client_(client), shape_(shape) {}
  float* Input(int layer) const;
  int64_t* RowCount(int layer) const;
  EventPoint Event(int layer, Counter counter) const;
  Status PoisonCount(int layer);
  Status Stash(int layer);
  Status Confirm(int layer);

  Client* const client_;  // not owned
  const StackShape shape_;
  void* stream_ = nullptr;  // cudaStream_t
  // One allocation: the layer inputs, the reload target, then a row-count slot per layer.
  uint8_t* arena_ = nullptr;
  float* reload_ = nullptr;
  int64_t* counts_ = nullptr;  // the experts' token counts [experts]
  std::vector<float*> weights_;
  std::vector<float*> weight_grads_;
  float* output_ = nullptr;
  float* dy_ = nullptr;
  float* dx_ = nullptr;
  std::unique_ptr<HostBuffer> control_;
  std::vector<Slot> slots_;
  uint64_t value_ = 0;  // steps begun: counters only grow, each step signals one higher
  StashTally tally_;
};

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_CUDA_TRAINER_H_

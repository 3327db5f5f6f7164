// The demo's model: a stack of grouped-linear expert layers (hidden -> hidden, ReLU between
// layers) run forward and backward on the CPU reference kernels, with each layer's saved input
// kept wherever an ActivationStore puts it between forward and backward.
//
// The same code runs the in-process reference (InProcessStore) and the stashed run (the
// daemon-backed store in daemon_store.h), so any difference in their bits comes from what the
// store hands back in backward, not from the arithmetic.
#ifndef STASH_EXAMPLES_EXPERT_STACK_H_
#define STASH_EXAMPLES_EXPERT_STACK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "examples/routing.h"
#include "stash/kernels/grouped_linear.h"
#include "stash/status.h"

namespace stash::demo {

// The static shape of a step; every activation is [max_tokens, hidden] fp32.
struct StackShape {
  int64_t max_tokens = 0;
  int64_t hidden = 0;
  int64_t experts = 0;
  int64_t layers = 0;

  kernels::GroupedLinearGeometry Geometry() const { return {max_tokens, hidden, hidden, experts}; }
  int64_t ActivationElements() const { return max_tokens * hidden; }
  uint64_t RowBytes() const { return static_cast<uint64_t>(hidden) * sizeof(float); }
  uint64_t ActivationBytes() const { return static_cast<uint64_t>(ActivationElements()) * 4; }
  int64_t WeightElements() const { return experts * hidden * hidden; }
};

// W_l [experts, hidden, hidden] for every layer, from (seed, layer): the same on every rank.
std::vector<std::vector<float>> MakeWeights(const StackShape& shape, uint64_t seed);

// One rank's inputs for one step.
struct StepInputs {
  Routing routing;
  // X_0 [max_tokens, hidden]: each valid row is its token's hidden state, router-padding rows
  // and rows past the valid ones are 0.
  std::vector<float> dispatched;
  // dLoss/dOutput [max_tokens, hidden]: random on valid rows, 0 past them.
  std::vector<float> output_grad;
};

// Routes `tokens` tokens and draws their hidden states and the loss gradient from `seed`.
StepInputs MakeStepInputs(const StackShape& shape, int64_t tokens, int64_t topk, uint64_t seed);

// What a step computes; compared bit for bit between the reference and the stashed run.
struct StepOutputs {
  std::vector<float> output;                     // [max_tokens, hidden]: the last layer's Y
  std::vector<float> input_grad;                 // [max_tokens, hidden]: dX_0
  std::vector<std::vector<float>> weight_grads;  // per layer [experts, hidden, hidden]
};

// Where the input of each layer lives between forward and backward. Forward calls, per layer,
// WillProduce, then writes Input(layer) and calls Produced, and calls Consumed once the layer's
// forward has read it for the last time; backward calls Restore in reverse layer order.
class ActivationStore {
 public:
  virtual ~ActivationStore() = default;

  // The buffer (ActivationElements() floats) that layer `layer`'s input is written into.
  virtual float* Input(int layer) = 0;
  // The producer is about to write Input(layer): a store may queue its copy now, gated on a
  // ready signal that Produced gives.
  virtual Status WillProduce(int layer) = 0;
  // Input(layer) is complete and holds `rows` valid rows.
  virtual Status Produced(int layer, int64_t rows) = 0;
  // Forward will not read Input(layer) again: a store may take the data away.
  virtual Status Consumed(int layer) = 0;
  // Backward: layer `layer`'s saved input, ActivationElements() floats; the valid rows must be
  // the ones forward produced, rows past them are 0 or never read. Valid until the next Restore.
  virtual StatusOr<const float*> Restore(int layer) = 0;
};

// Keeps every input in process memory: the reference.
class InProcessStore final : public ActivationStore {
 public:
  explicit InProcessStore(const StackShape& shape);

  float* Input(int layer) override;
  Status WillProduce(int) override { return Status::Ok(); }
  Status Produced(int, int64_t) override { return Status::Ok(); }
  Status Consumed(int) override { return Status::Ok(); }
  StatusOr<const float*> Restore(int layer) override;

 private:
  std::vector<std::vector<float>> inputs_;
};

// Forward through every layer: fills out->output and leaves the saved inputs in `store`.
Status StackForward(const StackShape& shape, const std::vector<std::vector<float>>& weights,
                    const StepInputs& inputs, ActivationStore& store, StepOutputs* out);

// Backward through every layer, last first: fills out->input_grad and out->weight_grads.
Status StackBackward(const StackShape& shape, const std::vector<std::vector<float>>& weights,
                     const StepInputs& inputs, ActivationStore& store, StepOutputs* out);

// The first element whose bits differ between `want` (the reference) and `got`.
struct Mismatch {
  int layer = 0;
  std::string what;  // e.g. "weight gradient dW[expert 2, 5, 17] = ... but the reference has ..."
};
// Checks the output, then the weight gradients from the last layer down (backward's order, so
// the first corrupted reload is named), then the input gradient. nullopt when all are equal.
std::optional<Mismatch> FirstMismatch(const StackShape& shape, const StepOutputs& want,
                                      const StepOutputs& got);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_EXPERT_STACK_H_

#include "examples/expert_stack.h"

#include <cmath>
#include <cstdio>
#include <cstring>

namespace stash::demo {
namespace {

// "WEIGHTS\0": keeps the weight streams apart from the (rank, step) streams.
constexpr uint64_t kWeightStream = 0x5745494748545300ULL;

Status KernelError(const char* pass, int layer, const std::string& error) {
  return InternalError(std::string(pass) + " of layer " + std::to_string(layer) + ": " + error);
}

std::string FloatText(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", static_cast<double>(v), bits);
  return buf;
}

// The index of the first element whose bits differ, or -1.
// Bitwise on purpose: parity means the same bits (NaN payloads and -0.0 included), not ==.
// NOLINTBEGIN(bugprone-suspicious-memory-comparison)
int64_t FirstDifference(const std::vector<float>& want, const std::vector<float>& got) {
  if (want.size() != got.size()) return 0;
  if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) return -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}
// NOLINTEND(bugprone-suspicious-memory-comparison)

std::string Differs(const std::string& element, float got, float want) {
  return element + " = " + FloatText(got) + " but the in-process reference has " + FloatText(want);
}

}  // namespace

std::vector<std::vector<float>> MakeWeights(const StackShape& shape, uint64_t seed) {
  // Uniform with variance 2 / hidden (He initialisation): activations keep their scale through
  // the ReLUs, so no layer drowns the next in zeros or infinities.
  const float scale = std::sqrt(6.0f / static_cast<float>(shape.hidden));
  std::vector<std::vector<float>> weights(static_cast<size_t>(shape.layers));
  for (int64_t l = 0; l < shape.layers; ++l) {
    SplitMix64 rng(MixSeed(seed, kWeightStream, static_cast<uint64_t>(l)));
    std::vector<float>& w = weights[static_cast<size_t>(l)];
    w.resize(static_cast<size_t>(shape.WeightElements()));
    for (float& v : w) v = rng.Symmetric() * scale;
  }
  return weights;
}

StepInputs MakeStepInputs(const StackShape& shape, int64_t tokens, int64_t topk, uint64_t seed) {
  SplitMix64 rng(seed);
  StepInputs in;
  in.routing = RouteTopK(tokens, shape.experts, topk, shape.max_tokens, rng.Next());
  const auto h = static_cast<size_t>(shape.hidden);
  std::vector<float> states(static_cast<size_t>(tokens) * h);
  for (float& v : states) v = rng.Symmetric();

  const auto elements = static_cast<size_t>(shape.ActivationElements());
  in.dispatched.assign(elements, 0.0f);
  in.output_grad.assign(elements, 0.0f);
  const int64_t rows = in.routing.rows();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = in.routing.token_of_row[static_cast<size_t>(r)];
    if (token < 0) continue;  // router padding: a zero row
    std::memcpy(&in.dispatched[static_cast<size_t>(r) * h], &states[static_cast<size_t>(token) * h],
                h * sizeof(float));
  }
  for (size_t i = 0; i < static_cast<size_t>(rows) * h; ++i) in.output_grad[i] = rng.Symmetric();
  return in;
}

InProcessStore::InProcessStore(const StackShape& shape)
    : inputs_(static_cast<size_t>(shape.layers),
              std::vector<float>(static_cast<size_t>(shape.ActivationElements()), 0.0f)) {}

float* InProcessStore::Input(int layer) { return inputs_[static_cast<size_t>(layer)].data(); }

StatusOr<const float*> InProcessStore::Restore(int layer) {
  return static_cast<const float*>(inputs_[static_cast<size_t>(layer)].data());
}

Status StackForward(const StackShape& shape, const std::vector<std::vector<float>>& weights,
                    const StepInputs& inputs, ActivationStore& store, StepOutputs* out) {
  const kernels::GroupedLinearGeometry geometry = shape.Geometry();
  const int64_t* counts = inputs.routing.counts.data();
  const int64_t rows = inputs.routing.rows();
  const auto elements = static_cast<size_t>(shape.ActivationElements());
  const int layers = static_cast<int>(shape.layers);
  out->output.assign(elements, 0.0f);

  // The dispatch is layer 0's producer.
  if (Status s = store.WillProduce(0); !s.ok()) return s;
  std::memcpy(store.Input(0), inputs.dispatched.data(), elements * sizeof(float));
  if (Status s = store.Produced(0, rows); !s.ok()) return s;

  std::string error;
  for (int l = 0; l < layers; ++l) {
    const bool last = l + 1 == layers;
    if (!last) {
      if (Status s = store.WillProduce(l + 1); !s.ok()) return s;
    }
    float* y = last ? out->output.data() : store.Input(l + 1);
    if (!kernels::GroupedLinearForward(geometry, counts, store.Input(l),
                                       weights[static_cast<size_t>(l)].data(), y, &error)) {
      return KernelError("forward", l, error);
    }
    if (!last) {
      for (size_t i = 0; i < elements; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;  // ReLU
      if (Status s = store.Produced(l + 1, rows); !s.ok()) return s;
    }
    if (Status s = store.Consumed(l); !s.ok()) return s;
  }
  return Status::Ok();
}

Status StackBackward(const StackShape& shape, const std::vector<std::vector<float>>& weights,
                     const StepInputs& inputs, ActivationStore& store, StepOutputs* out) {
  const kernels::GroupedLinearGeometry geometry = shape.Geometry();
  const int64_t* counts = inputs.routing.counts.data();
  const auto elements = static_cast<size_t>(shape.ActivationElements());
  out->weight_grads.assign(static_cast<size_t>(shape.layers),
                           std::vector<float>(static_cast<size_t>(shape.WeightElements())));
  std::vector<float> dy = inputs.output_grad;  // dLoss/dY of the layer at hand
  std::vector<float> dx(elements);
  std::string error;
  for (int l = static_cast<int>(shape.layers) - 1; l >= 0; --l) {
    StatusOr<const float*> x = store.Restore(l);
    if (!x.ok()) return x.status();
    const float* w = weights[static_cast<size_t>(l)].data();
    if (!kernels::GroupedLinearBackwardWeight(geometry, counts, *x, dy.data(),
                                              out->weight_grads[static_cast<size_t>(l)].data(),
                                              &error)) {
      return KernelError("weight gradient", l, error);
    }
    if (!kernels::GroupedLinearBackwardData(geometry, counts, dy.data(), w, dx.data(), &error)) {
      return KernelError("input gradient", l, error);
    }
    if (l > 0) {
      // X_l = ReLU(Y_{l-1}), so dY_{l-1} = dX_l where X_l > 0: the saved input is the mask.
      for (size_t i = 0; i < elements; ++i) dy[i] = (*x)[i] > 0.0f ? dx[i] : 0.0f;
    }
  }
  out->input_grad = dx;
  return Status::Ok();
}

std::optional<Mismatch> FirstMismatch(const StackShape& shape, const StepOutputs& want,
                                      const StepOutputs& got) {
  const int64_t h = shape.hidden;
  const int last = static_cast<int>(shape.layers) - 1;
  if (int64_t i = FirstDifference(want.output, got.output); i >= 0) {
    return Mismatch{
        last,
        Differs("output Y[row " + std::to_string(i / h) + ", col " + std::to_string(i % h) + "]",
                got.output[static_cast<size_t>(i)], want.output[static_cast<size_t>(i)])};
  }
  for (int l = last; l >= 0; --l) {
    const std::vector<float>& w = want.weight_grads[static_cast<size_t>(l)];
    const std::vector<float>& g = got.weight_grads[static_cast<size_t>(l)];
    if (int64_t i = FirstDifference(w, g); i >= 0) {
      return Mismatch{
          l, Differs("weight gradient dW[expert " + std::to_string(i / (h * h)) + ", row " +
                         std::to_string(i / h % h) + ", col " + std::to_string(i % h) + "]",
                     g[static_cast<size_t>(i)], w[static_cast<size_t>(i)])};
    }
  }
  if (int64_t i = FirstDifference(want.input_grad, got.input_grad); i >= 0) {
    return Mismatch{0, Differs("input gradient dX[row " + std::to_string(i / h) + ", col " +
                                   std::to_string(i % h) + "]",
                               got.input_grad[static_cast<size_t>(i)],
                               want.input_grad[static_cast<size_t>(i)])};
  }
  return std::nullopt;
}

}  // namespace stash::demo

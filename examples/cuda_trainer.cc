#include "examples/cuda_trainer.h"

#include <cuda_runtime_api.h>

#include <string>

#include "examples/cuda_elementwise.h"
#include "stash/kernels/grouped_linear_cuda.h"

namespace stash::demo {
namespace {

constexpr int kPoison = 0xFF;  // every float a NaN: reading freed memory cannot pass parity

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return InternalError(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define DEMO_CUDA(expr)                                                    \
  do {                                                                     \
    if (Status demo_cuda_ = CudaStatus((expr), #expr); !demo_cuda_.ok()) { \
      return demo_cuda_;                                                   \
    }                                                                      \
  } while (0)

uint64_t Stride(const StackShape& shape) { return (shape.ActivationBytes() + 255) / 256 * 256; }

Status KernelFailed(const char* pass, int layer, const std::string& error) {
  return InternalError(std::string(pass) + " of layer " + std::to_string(layer) + ": " + error);
}

}  // namespace

StatusOr<std::unique_ptr<CudaTrainer>> CudaTrainer::Create(
    Client* client, int device, const StackShape& shape,
    const std::vector<std::vector<float>>& weights) {
  DEMO_CUDA(cudaSetDevice(device));
  std::string error;
  if (!kernels::CanImplementGroupedLinearCuda(shape.Geometry(), &error)) {
    return InvalidArgumentError("the CUDA grouped linear cannot run this shape: " + error);
  }
  std::unique_ptr<CudaTrainer> t(new CudaTrainer(client, shape));
  cudaStream_t stream = nullptr;
  DEMO_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  t->stream_ = stream;
  const auto layers = static_cast<uint64_t>(shape.layers);
  const uint64_t stride = Stride(shape);
  void* arena = nullptr;
  DEMO_CUDA(cudaMalloc(&arena, (layers + 1) * stride + layers * sizeof(int64_t)));
  t->arena_ = static_cast<uint8_t*>(arena);
  t->reload_ = reinterpret_cast<float*>(t->arena_ + layers * stride);

  const uint64_t activation = shape.ActivationBytes();
  const uint64_t weight_bytes = static_cast<uint64_t>(shape.WeightElements()) * sizeof(float);
  void* p = nullptr;
  DEMO_CUDA(cudaMalloc(&p, static_cast<uint64_t>(shape.experts) * sizeof(int64_t)));
  t->counts_ = static_cast<int64_t*>(p);
  for (float** out : {&t->output_, &t->dy_, &t->dx_}) {
    DEMO_CUDA(cudaMalloc(&p, activation));
    *out = static_cast<float*>(p);
  }
  for (uint64_t l = 0; l < layers; ++l) {
    DEMO_CUDA(cudaMalloc(&p, weight_bytes));
    t->weights_.push_back(static_cast<float*>(p));
    DEMO_CUDA(cudaMemcpy(p, weights[l].data(), weight_bytes, cudaMemcpyHostToDevice));
    DEMO_CUDA(cudaMalloc(&p, weight_bytes));
    t->weight_grads_.push_back(static_cast<float*>(p));
  }
  // The weights went up with cudaMemcpy from pageable memory, on the legacy stream: the call may
  // return before they land, and the trainer's stream (non-blocking) does not wait for it.
  DEMO_CUDA(cudaDeviceSynchronize());
  auto control = HostBuffer::Allocate(layers * kCounters * sizeof(uint64_t));
  if (!control.ok()) return control.status();
  t->control_ = std::move(control).value();
  t->slots_.resize(layers);
  return t;
}

CudaTrainer::~CudaTrainer() {
  // Frees happen after the stream drained, and the arena only once the daemon closed its IPC
  // mapping of it (CUDA forbids freeing exported memory an importer still has open).
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (arena_ != nullptr) {
    StatusOr<uint64_t> op = client_->UnregisterDevice(arena_);
    if (op.ok()) (void)client_->Wait(*op, kAnswerTimeoutMs);
  }
  for (void* p : {static_cast<void*>(arena_), static_cast<void*>(counts_),
                  static_cast<void*>(output_), static_cast<void*>(dy_), static_cast<void*>(dx_)}) {
    if (p != nullptr) cudaFree(p);
  }
  for (float* w : weights_) cudaFree(w);
  for (float* w : weight_grads_) cudaFree(w);
}

float* CudaTrainer::Input(int layer) const {
  return reinterpret_cast<float*>(arena_ + static_cast<uint64_t>(layer) * Stride(shape_));
}

int64_t* CudaTrainer::RowCount(int layer) const {
  const auto layers = static_cast<uint64_t>(shape_.layers);
  return reinterpret_cast<int64_t*>(arena_ + (layers + 1) * Stride(shape_)) + layer;
}

EventPoint CudaTrainer::Event(int layer, Counter counter) const {
  const uint64_t index = static_cast<uint64_t>(layer) * kCounters + counter;
  return EventPoint{control_.get(), index * sizeof(uint64_t), value_};
}

void CudaTrainer::BeginStep() {
  ++value_;
  tally_ = StashTally{};
  for (Slot& slot : slots_) slot = Slot{};
}

// Before Input(layer)'s producer: -1 in the count slot, which the daemon would reject, so
// parity proves it read the slot only after the ready event.
Status CudaTrainer::PoisonCount(int layer) {
  DEMO_CUDA(StoreInt64Cuda(RowCount(layer), -1, static_cast<cudaStream_t>(stream_)));
  return Status::Ok();
}

// Asks for the stash of Input(layer) once its producer, the row count and the ready signal are
// queued. Never before: with lazy module loading (the default since CUDA 12.2) the producer's
// first launch may need a context-wide synchronisation, which would wait for a stream that
// waits on the daemon while the daemon waits for a ready signal not yet queued. The Python
// path (stashd.torch) keeps the same order.
Status CudaTrainer::Stash(int layer) {
  StashArgs args = LayerStashArgs(shape_, layer);
  args.device_source = Input(layer);
  args.count.device_count = RowCount(layer);
  args.ready = Event(layer, kStashReady);
  StatusOr<uint64_t> ticket = client_->Stash(args);
  if (!ticket.ok()) {
    return LayerError(layer, "stash", ticket.status());
  }
  slots_[static_cast<size_t>(layer)].ticket = *ticket;
  return Status::Ok();
}

// Input(layer) is read for the last time by the kernels queued so far: once the daemon holds
// the copy, poison the rank's own (after those kernels, in stream order).
Status CudaTrainer::Confirm(int layer) {
  Slot& slot = slots_[static_cast<size_t>(layer)];
  StatusOr<bool> taken =
      AwaitStash(client_, shape_, layer, slot.ticket, slot.rows, &tally_, &slot.tier);
  if (!taken.ok()) return taken.status();
  if (*taken) {
    DEMO_CUDA(cudaMemsetAsync(Input(layer), kPoison, shape_.ActivationBytes(),
                              static_cast<cudaStream_t>(stream_)));
  }
  return Status::Ok();
}

Status CudaTrainer::Forward(const StepInputs& inputs, StepOutputs* out) {
  const auto stream = static_cast<cudaStream_t>(stream_);
  const kernels::GroupedLinearGeometry geometry = shape_.Geometry();
  const int64_t elements = shape_.ActivationElements();
  const int64_t rows = inputs.routing.rows();
  const int layers = static_cast<int>(shape_.layers);
  DEMO_CUDA(cudaMemcpyAsync(counts_, inputs.routing.counts.data(),
                            inputs.routing.counts.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                            stream));

  // The dispatch is layer 0's producer.
  if (Status s = PoisonCount(0); !s.ok()) return s;
  DEMO_CUDA(cudaMemcpyAsync(Input(0), inputs.dispatched.data(), shape_.ActivationBytes(),
                            cudaMemcpyHostToDevice, stream));
  DEMO_CUDA(StoreInt64Cuda(RowCount(0), rows, stream));
  slots_[0].rows = rows;
  if (Status s = client_->EnqueueSignal(Event(0, kStashReady), stream); !s.ok()) return s;
  if (Status s = Stash(0); !s.ok()) return s;

  std::string error;
  for (int l = 0; l < layers; ++l) {
    const bool last = l + 1 == layers;
    if (!last) {
      if (Status s = PoisonCount(l + 1); !s.ok()) return s;
    }
    float* y = last ? output_ : Input(l + 1);
    if (!kernels::GroupedLinearForwardCuda(geometry, counts_, Input(l),
                                           weights_[static_cast<size_t>(l)], y, stream, &error)) {
      return KernelFailed("forward", l, error);
    }
    if (!last) {
      DEMO_CUDA(ReluCuda(y, elements, stream));
      DEMO_CUDA(StoreInt64Cuda(RowCount(l + 1), rows, stream));
      slots_[static_cast<size_t>(l) + 1].rows = rows;
      if (Status s = client_->EnqueueSignal(Event(l + 1, kStashReady), stream); !s.ok()) {
        return s;
      }
      if (Status s = Stash(l + 1); !s.ok()) return s;
    }
    if (Status s = Confirm(l); !s.ok()) return s;
  }
  out->output.assign(static_cast<size_t>(elements), 0.0f);
  DEMO_CUDA(cudaMemcpyAsync(out->output.data(), output_, shape_.ActivationBytes(),
                            cudaMemcpyDeviceToHost, stream));
  DEMO_CUDA(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaTrainer::Backward(const StepInputs& inputs, StepOutputs* out) {
  const auto stream = static_cast<cudaStream_t>(stream_);
  const kernels::GroupedLinearGeometry geometry = shape_.Geometry();
  const int64_t elements = shape_.ActivationElements();
  const uint64_t weight_bytes = static_cast<uint64_t>(shape_.WeightElements()) * sizeof(float);
  DEMO_CUDA(cudaMemcpyAsync(dy_, inputs.output_grad.data(), shape_.ActivationBytes(),
                            cudaMemcpyHostToDevice, stream));
  std::string error;
  for (int l = static_cast<int>(shape_.layers) - 1; l >= 0; --l) {
    Slot& slot = slots_[static_cast<size_t>(l)];
    const float* x = Input(l);  // an overflowed stash stayed here
    if (slot.tier != Tier::kOverflow) {
      // The previous layer's kernels read reload_: poison it after them, then let the daemon
      // write it, and make the kernels below wait for the copy. The host waits for nothing.
      DEMO_CUDA(cudaMemsetAsync(reload_, kPoison, shape_.ActivationBytes(), stream));
      if (Status s = client_->EnqueueSignal(Event(l, kReloadReady), stream); !s.ok()) return s;
      ReloadArgs args;
      args.ticket = slot.ticket;
      args.device_destination = reload_;
      args.zero_tail = true;
      args.ready = Event(l, kReloadReady);
      args.done = Event(l, kReloadDone);
      StatusOr<uint64_t> op = client_->Reload(args);
      if (!op.ok()) {
        return LayerError(l, "reload", op.status());
      }
      slot.reload = *op;
      if (Status s = client_->EnqueueWait(Event(l, kReloadDone), stream); !s.ok()) return s;
      x = reload_;
    }
    const float* w = weights_[static_cast<size_t>(l)];
    if (!kernels::GroupedLinearBackwardWeightCuda(
            geometry, counts_, x, dy_, weight_grads_[static_cast<size_t>(l)], stream, &error)) {
      return KernelFailed("weight gradient", l, error);
    }
    if (!kernels::GroupedLinearBackwardDataCuda(geometry, counts_, dy_, w, dx_, stream, &error)) {
      return KernelFailed("input gradient", l, error);
    }
    // X_l = ReLU(Y_{l-1}), so dY_{l-1} = dX_l where X_l > 0: the saved input is the mask.
    if (l > 0) DEMO_CUDA(ReluMaskCuda(x, dx_, dy_, elements, stream));
  }
  // The answers, once everything is queued: a failed reload still raises its done event, so
  // the stream never hangs, and its error surfaces here.
  for (int l = static_cast<int>(shape_.layers) - 1; l >= 0; --l) {
    const Slot& slot = slots_[static_cast<size_t>(l)];
    if (slot.reload == 0) continue;
    StatusOr<Completion> done = client_->Wait(slot.reload, kAnswerTimeoutMs);
    if (!done.ok()) {
      return LayerError(l, "reload", done.status());
    }
    if (Status s = CheckReload(l, *done, slot.rows, slot.tier); !s.ok()) return s;
  }
  out->input_grad.assign(static_cast<size_t>(elements), 0.0f);
  DEMO_CUDA(cudaMemcpyAsync(out->input_grad.data(), dx_, shape_.ActivationBytes(),
                            cudaMemcpyDeviceToHost, stream));
  out->weight_grads.assign(static_cast<size_t>(shape_.layers),
                           std::vector<float>(static_cast<size_t>(shape_.WeightElements())));
  for (size_t l = 0; l < out->weight_grads.size(); ++l) {
    DEMO_CUDA(cudaMemcpyAsync(out->weight_grads[l].data(), weight_grads_[l], weight_bytes,
                              cudaMemcpyDeviceToHost, stream));
  }
  DEMO_CUDA(cudaStreamSynchronize(stream));
  return Status::Ok();
}

}  // namespace stash::demo

#include "examples/daemon_store.h"

#include <cstring>
#include <string>

namespace stash::demo {
namespace {

// Every byte 0xFF: each float reads as a NaN, so a reader of freed memory cannot pass parity.
constexpr int kPoison = 0xFF;

std::string LayerText(int layer) { return "layer " + std::to_string(layer) + ": "; }

}  // namespace

Status LayerError(int layer, const char* what, const Status& status) {
  return Status(status.code(), LayerText(layer) + what + ": " + status.message());
}

StashArgs LayerStashArgs(const StackShape& shape, int layer) {
  StashArgs args;
  args.row_bytes = shape.RowBytes();
  args.max_rows = static_cast<uint64_t>(shape.max_tokens);
  args.layer = static_cast<uint32_t>(layer);
  args.name = "expert_fc_input";
  return args;
}

StatusOr<bool> AwaitStash(Client* client, const StackShape& shape, int layer, uint64_t ticket,
                          int64_t published_rows, StashTally* tally, Tier* tier) {
  StatusOr<Completion> answer = client->Wait(ticket, kAnswerTimeoutMs);
  if (!answer.ok()) {
    return LayerError(layer, "stash", answer.status());
  }
  const Completion& done = *answer;
  *tier = done.tier;
  if (done.rows != static_cast<uint64_t>(published_rows)) {
    return InternalError(LayerText(layer) + "the daemon stashed " + std::to_string(done.rows) +
                         " rows but the producer published " + std::to_string(published_rows));
  }
  switch (done.tier) {
    case Tier::kDevice:
    case Tier::kHost:
    case Tier::kPeer:  // another device's pool (mapped chunks, daemon-copy's peer tier): a spill
      (done.tier == Tier::kDevice ? tally->device : tally->host) += 1;
      tally->bytes += done.bytes;
      tally->pages += done.pages;
      return true;
    case Tier::kOverflow:
      // Nothing was taken: the rank keeps its copy and backward reads it.
      tally->overflow += 1;
      tally->kept_bytes += shape.ActivationBytes();
      return false;
    case Tier::kUnspecified:
      break;
  }
  return InternalError(LayerText(layer) + "the daemon's stash answer names no tier");
}

Status CheckReload(int layer, const Completion& done, int64_t rows, Tier tier) {
  if (done.rows == static_cast<uint64_t>(rows) && done.tier == tier) return Status::Ok();
  return InternalError(LayerText(layer) + "the reload brought " + std::to_string(done.rows) +
                       " rows from the " + TierName(done.tier) + " tier, but " +
                       std::to_string(rows) + " rows went to the " + TierName(tier) + " tier");
}

StatusOr<std::unique_ptr<DaemonStore>> DaemonStore::Create(Client* client,
                                                           const StackShape& shape) {
  std::unique_ptr<DaemonStore> store(new DaemonStore(client, shape));
  for (int64_t l = 0; l < shape.layers; ++l) {
    auto buffer = HostBuffer::Allocate(shape.ActivationBytes());
    if (!buffer.ok()) return buffer.status();
    store->inputs_.push_back(std::move(buffer).value());
  }
  auto reload = HostBuffer::Allocate(shape.ActivationBytes());
  if (!reload.ok()) return reload.status();
  store->reload_ = std::move(reload).value();
  auto control = HostBuffer::Allocate(16 * static_cast<uint64_t>(shape.layers));
  if (!control.ok()) return control.status();
  store->control_ = std::move(control).value();
  store->slots_.resize(static_cast<size_t>(shape.layers));
  return store;
}

int64_t* DaemonStore::CountSlot(int layer) const {
  return reinterpret_cast<int64_t*>(control_->data() + 16 * static_cast<uint64_t>(layer));
}

EventPoint DaemonStore::ReadyEvent(int layer) const {
  return EventPoint{control_.get(), 16 * static_cast<uint64_t>(layer) + 8, ready_value_};
}

void DaemonStore::BeginStep() {
  ++ready_value_;
  tally_ = StashTally{};
  for (Slot& slot : slots_) slot = Slot{};
}

float* DaemonStore::Input(int layer) {
  return reinterpret_cast<float*>(inputs_[static_cast<size_t>(layer)]->data());
}

Status DaemonStore::WillProduce(int layer) {
  // The count is not known yet: a negative value the daemon would reject proves it reads the
  // slot only after the ready event, as the sync-free protocol demands.
  *CountSlot(layer) = -1;
  StashArgs args = LayerStashArgs(shape_, layer);
  args.source = inputs_[static_cast<size_t>(layer)].get();
  args.count.buffer = control_.get();
  args.count.offset = 16 * static_cast<uint64_t>(layer);
  args.ready = ReadyEvent(layer);
  StatusOr<uint64_t> ticket = client_->Stash(args);
  if (!ticket.ok()) {
    return LayerError(layer, "stash", ticket.status());
  }
  slots_[static_cast<size_t>(layer)].ticket = *ticket;
  return Status::Ok();
}

Status DaemonStore::Produced(int layer, int64_t rows) {
  slots_[static_cast<size_t>(layer)].rows = rows;
  *CountSlot(layer) = rows;
  SignalEvent(ReadyEvent(layer));  // releases the count and the rows to the daemon
  return Status::Ok();
}

Status DaemonStore::Consumed(int layer) {
  Slot& slot = slots_[static_cast<size_t>(layer)];
  StatusOr<bool> taken =
      AwaitStash(client_, shape_, layer, slot.ticket, slot.rows, &tally_, &slot.tier);
  if (!taken.ok()) return taken.status();
  // The daemon has the rows: the rank frees its copy. Poisoning stands in for the free, so
  // backward passes parity only with what comes back from the daemon.
  if (*taken) std::memset(Input(layer), kPoison, shape_.ActivationBytes());
  return Status::Ok();
}

StatusOr<const float*> DaemonStore::Restore(int layer) {
  const Slot& slot = slots_[static_cast<size_t>(layer)];
  if (slot.tier == Tier::kOverflow) return static_cast<const float*>(Input(layer));
  // A freshly allocated tensor holds garbage: the reload must write every row.
  std::memset(reload_->data(), kPoison, reload_->size());
  ReloadArgs args;
  args.ticket = slot.ticket;
  args.destination = reload_.get();
  args.zero_tail = true;
  StatusOr<uint64_t> op = client_->Reload(args);
  if (!op.ok()) {
    return LayerError(layer, "reload", op.status());
  }
  StatusOr<Completion> done = client_->Wait(*op, kAnswerTimeoutMs);
  if (!done.ok()) {
    return LayerError(layer, "reload", done.status());
  }
  if (Status s = CheckReload(layer, *done, slot.rows, slot.tier); !s.ok()) return s;
  return static_cast<const float*>(reinterpret_cast<float*>(reload_->data()));
}

}  // namespace stash::demo

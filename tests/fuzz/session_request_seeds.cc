// Writes the seed corpus of session_request_fuzzer: valid request sequences of every kind against
// the session the fuzzer starts from (session_input.h), one file each, named seed-<what>.
//
//   session_request_seeds DIR     (./scripts/fuzz --seeds writes tests/fuzz/corpus/session_request)
//
// The seeds are built from the generated protobuf classes, so rerunning this after a proto change
// keeps them valid.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "stash/v1/stash.pb.h"
#include "tests/fuzz/session_input.h"

namespace stash::fuzz {
namespace {

namespace v1 = stash::v1;

uint64_t next_id = 1;

v1::SessionRequest Request() {
  v1::SessionRequest r;
  r.set_request_id(next_id++);
  return r;
}

v1::SessionRequest Hello(v1::Backend backend, int32_t device) {
  v1::SessionRequest r;  // a Hello carries no request_id
  v1::Hello* h = r.mutable_hello();
  h->set_backend(backend);
  h->set_device(device);
  h->set_rank(3);
  h->set_pid(4242);
  h->set_client_version("0.1.0");
  h->set_label("llama-moe");
  h->set_allow_host_spill(true);
  return r;
}

v1::SessionRequest Register(uint64_t id, uint64_t bytes,
                            v1::MemoryKind kind = v1::MEMORY_KIND_HOST_FD) {
  v1::SessionRequest r = Request();
  v1::RegisterMemory* m = r.mutable_register_memory();
  m->set_memory_id(id);
  m->set_kind(kind);
  m->set_bytes(bytes);
  if (kind == v1::MEMORY_KIND_CUDA_IPC) {  // MEMORY_KIND_HOST_FD has no handle
    m->set_handle(std::string(64, '\x5a'));
    m->set_device_uuid(std::string(16, '\x01'));
  }
  return r;
}

v1::SessionRequest Unregister(uint64_t id) {
  v1::SessionRequest r = Request();
  r.mutable_unregister_memory()->set_memory_id(id);
  return r;
}

void SetCounter(v1::EventRef* ev, uint64_t memory_id, uint64_t offset, uint64_t value) {
  ev->mutable_counter()->set_memory_id(memory_id);
  ev->mutable_counter()->set_offset(offset);
  ev->set_value(value);
}

v1::SessionRequest Stash(uint64_t ticket, uint64_t memory_id, uint64_t offset, uint64_t row_bytes,
                         uint64_t max_rows) {
  v1::SessionRequest r = Request();
  v1::Stash* s = r.mutable_stash();
  s->set_ticket(ticket);
  s->mutable_source()->set_memory_id(memory_id);
  s->mutable_source()->set_offset(offset);
  s->set_row_bytes(row_bytes);
  s->set_max_rows(max_rows);
  s->mutable_count()->set_value(max_rows);
  s->set_layer(2);
  s->set_microbatch(1);
  s->set_name("experts.fc1");
  return r;
}

// A sync-free stash: the count is an int64 in client memory, read after the ready counter.
v1::SessionRequest StashByReference(uint64_t ticket, uint32_t divisor) {
  v1::SessionRequest r = Stash(ticket, kBigMemory, 4096, 128, 256);
  v1::RowCount* c = r.mutable_stash()->mutable_count();
  c->mutable_reference()->set_memory_id(kSmallMemory);
  c->mutable_reference()->set_offset(64);
  c->set_divisor(divisor);
  SetCounter(r.mutable_stash()->mutable_ready(), kSmallMemory, 0, 1);
  SetCounter(r.mutable_stash()->mutable_done(), kSmallMemory, 8, 1);
  return r;
}

v1::SessionRequest Reload(uint64_t ticket, uint64_t memory_id, uint64_t offset, bool with_events) {
  v1::SessionRequest r = Request();
  v1::Reload* l = r.mutable_reload();
  l->set_ticket(ticket);
  l->mutable_destination()->set_memory_id(memory_id);
  l->mutable_destination()->set_offset(offset);
  l->set_zero_tail(true);
  if (with_events) {
    SetCounter(l->mutable_ready(), kSmallMemory, 16, 2);
    SetCounter(l->mutable_done(), kSmallMemory, 24, 2);
  }
  return r;
}

v1::SessionRequest Release(uint64_t ticket) {
  v1::SessionRequest r = Request();
  r.mutable_release()->set_ticket(ticket);
  return r;
}

v1::SessionRequest BeginStep(uint64_t step) {
  v1::SessionRequest r = Request();
  r.mutable_begin_step()->set_step(step);
  return r;
}

using Seed = std::pair<std::string, std::string>;  // file name, contents

std::vector<Seed> Seeds() {
  constexpr uint8_t kHost = 0;
  constexpr uint8_t kCuda = kSetupCuda | (3 << 2);  // 4 pools
  constexpr uint64_t kTicket = 0x5eed5eed5eed5eedULL;
  std::vector<Seed> seeds;
  auto add = [&](const std::string& name, uint8_t setup,
                 const std::vector<v1::SessionRequest>& reqs) {
    seeds.emplace_back("seed-" + name, JoinInput(setup, reqs));
  };
  add("hello-host", kHost, {Hello(v1::BACKEND_HOST, 0)});
  add("hello-cuda", kCuda, {Hello(v1::BACKEND_CUDA, 3)});
  v1::SessionRequest grouped = Hello(v1::BACKEND_HOST, 0);
  grouped.mutable_hello()->set_group("torchrun:run-41@10.0.0.1:29500");
  grouped.mutable_hello()->set_group_secret(std::string(32, 's'));
  add("hello-group", kHost, {grouped});
  v1::SessionRequest again = Hello(v1::BACKEND_HOST, 0);
  again.set_request_id(next_id++);
  add("second-hello", kHost, {again});
  add("register-host", kHost, {Register(10, 1 << 16)});
  add("register-cuda-ipc", kCuda, {Register(10, 1 << 20, v1::MEMORY_KIND_CUDA_IPC)});
  add("unregister", kHost, {Unregister(kHugeMemory)});
  add("register-unregister-register", kHost,
      {Register(10, 4096), Unregister(10), Register(10, 8192)});
  add("stash-value", kHost, {Stash(kTicket, kBigMemory, 0, 64, 1024)});
  add("stash-to-the-last-byte", kHost, {Stash(kTicket, kBigMemory, 4096, 1024, 1020)});
  add("stash-huge-memory", kHost, {Stash(kTicket, kHugeMemory, 1 << 20, uint64_t{1} << 30, 1024)});
  add("stash-by-reference", kHost, {StashByReference(kTicket, 1)});
  add("stash-mxfp8-scale-inv", kHost, {StashByReference(kTicket, 32)});
  add("stash-cuda-ipc", kCuda, {Stash(kTicket, kCudaMemory, 0, 7168, 4096)});
  add("reload-setup-ticket", kHost, {Reload(kTicketBig, kBigMemory, 1024, false)});
  add("reload-with-events", kHost, {Reload(kTicketSmall, kSmallMemory, 0, true)});
  add("release-setup-ticket", kHost, {Release(kTicketBig)});
  add("begin-step", kHost, {BeginStep(7)});
  add("stash-reload-release", kHost,
      {Stash(kTicket, kBigMemory, 0, 64, 1024), Reload(kTicket, kBigMemory, 65536, true),
       Stash(kTicket + 1, kBigMemory, 0, 64, 16), Release(kTicket + 1)});
  add("one-step", kCuda,
      {BeginStep(1), Register(10, 1 << 20, v1::MEMORY_KIND_CUDA_IPC),
       Stash(kTicket, 10, 0, 4096, 256), StashByReference(kTicket + 1, 32),
       Reload(kTicket + 1, kBigMemory, 4096, true), Reload(kTicket, 10, 0, true), Unregister(10)});
  std::vector<v1::SessionRequest> burst;  // runs into kTightInflight and kTightMemories
  for (uint64_t i = 0; i < 6; ++i) burst.push_back(Register(10 + i, 4096));
  for (uint64_t i = 0; i < 6; ++i) burst.push_back(Stash(kTicket + i, kBigMemory, 0, 64, 16));
  add("tight-limits", kSetupTight, burst);
  add("tight-total", kSetupTightTotal,
      {Register(10, 4096), Register(11, 4096), Unregister(10), Register(12, 4096)});
  return seeds;
}

}  // namespace
}  // namespace stash::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR   (writes the seed corpus of session_request_fuzzer)\n",
                 argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : stash::fuzz::Seeds()) {
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "session_request_seeds: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

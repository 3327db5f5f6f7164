// stash-test-client: a scripted client process for tests that kill clients.
//   stash-test-client SOCKET MODE BYTES
// MODE hold: stash BYTES and wait for the daemon's answer, print "stashed <pages>", then sleep.
// MODE midstash: queue a stash of BYTES whose ready event is never signalled, print "queued",
//   then sleep (the daemon holds the request, waiting for the event).
// MODE churn: a mapped session with an automatic lease; prints "leased" once open, then runs
//   steps for ever: BeginStep, 4 stashes of up to BYTES (random counts), reloads, a release,
//   so a kill lands anywhere in a step (mid-copy, mid-lease, mid-return).
// MODE once, once-mapped: one session of that mode stashes BYTES, reloads them, checks them
//   byte for byte and exits: 0 and "ok" when all of it worked, 1 with the error otherwise.
// STASH_TEST_CLIENT_BACKEND=cuda: the session speaks the cuda backend (its buffers stay host
//   memory), for a stashd --backend=cuda (tests/integration/cuda_standin_test.cc).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "stash/client.h"

namespace {

int Fail(const stash::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}

int Once(stash::Client& client, const stash::HostBuffer& buffer) {
  auto destination = stash::HostBuffer::Allocate(buffer.size());
  if (!destination.ok()) return Fail(destination.status());
  stash::StashArgs args;
  args.source = &buffer;
  args.row_bytes = 1;
  args.max_rows = buffer.size();
  args.count.value = buffer.size();
  auto ticket = client.Stash(args);
  if (!ticket.ok()) return Fail(ticket.status());
  auto stashed = client.Wait(*ticket);
  if (!stashed.ok()) return Fail(stashed.status());
  if (stashed->tier == stash::Tier::kOverflow) {
    std::fprintf(stderr, "the stash overflowed\n");
    return 1;
  }
  auto op = client.Reload({*ticket, destination->get(), 0, false, {}, {}, nullptr});
  if (!op.ok()) return Fail(op.status());
  if (auto done = client.Wait(*op); !done.ok()) return Fail(done.status());
  if (std::memcmp((*destination)->data(), buffer.data(), buffer.size()) != 0) {
    std::fprintf(stderr, "the reloaded bytes differ\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}

int Churn(stash::Client& client, const stash::HostBuffer& buffer) {
  std::printf("leased\n");
  std::fflush(stdout);
  auto destination = stash::HostBuffer::Allocate(buffer.size());
  if (!destination.ok()) return 1;
  for (uint64_t step = 0;; ++step) {
    auto begun = client.BeginStep(step);
    if (!begun.ok()) return Fail(begun.status());
    uint64_t tickets[4] = {};
    for (uint64_t& ticket : tickets) {
      stash::StashArgs args;
      args.source = &buffer;
      args.row_bytes = 1;
      args.max_rows = buffer.size();
      args.count.value = 1 + static_cast<uint64_t>(std::rand()) % buffer.size();
      auto t = client.Stash(args);
      if (!t.ok()) return Fail(t.status());
      ticket = *t;
    }
    for (int i = 0; i < 3; ++i) {
      auto stashed = client.Wait(tickets[i]);
      if (!stashed.ok()) return Fail(stashed.status());
      if (stashed->tier == stash::Tier::kOverflow) continue;  // kept here: nothing to reload
      auto op = client.Reload({tickets[i], destination->get(), 0, false, {}, {}, nullptr});
      if (!op.ok()) return Fail(op.status());
      if (auto done = client.Wait(*op); !done.ok()) return Fail(done.status());
    }
    auto last = client.Wait(tickets[3]);
    if (!last.ok()) return Fail(last.status());
    if (last->tier == stash::Tier::kOverflow) continue;
    auto op = client.Release(tickets[3]);
    if (!op.ok()) return Fail(op.status());
    if (auto done = client.Wait(*op); !done.ok()) return Fail(done.status());
  }
}

}  // namespace

// Two stashes of the whole buffer, held (the second overflows when the lease holds one), then
// waits to be killed: "held TIER TIER" once both are done.
int HoldTwice(stash::Client& client, const stash::HostBuffer& buffer) {
  std::string tiers;
  for (int i = 0; i < 2; ++i) {
    stash::StashArgs args;
    args.source = &buffer;
    args.row_bytes = 1;
    args.max_rows = buffer.size();
    args.count.value = buffer.size();
    auto ticket = client.Stash(args);
    if (!ticket.ok()) return Fail(ticket.status());
    auto done = client.Wait(*ticket);
    if (!done.ok()) return Fail(done.status());
    tiers += done->tier == stash::Tier::kOverflow ? " overflow" : " placed";
  }
  std::printf("held%s\n", tiers.c_str());
  std::fflush(stdout);
  while (true) pause();
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(
        stderr,
        "usage: stash-test-client SOCKET hold|hold-mapped|midstash|churn|once|once-mapped BYTES\n");
    return 2;
  }
  const std::string mode = argv[2];
  const uint64_t bytes = std::strtoull(argv[3], nullptr, 10);
  stash::Options options;
  options.socket = argv[1];
  const char* backend = std::getenv("STASH_TEST_CLIENT_BACKEND");
  if (backend != nullptr && std::string(backend) == "cuda") options.backend = stash::Backend::kCuda;
  if (mode == "churn" || mode == "once-mapped" || mode == "hold-mapped")
    options.mode = stash::Mode::kMapped;
  auto client = stash::Client::Open(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto buffer = stash::HostBuffer::Allocate(bytes);
  auto events = stash::HostBuffer::Allocate(4096);
  if (!buffer.ok() || !events.ok()) return 1;
  std::memset((*buffer)->data(), 0x5a, bytes);
  if (mode == "churn") return Churn(**client, **buffer);
  if (mode == "once" || mode == "once-mapped") return Once(**client, **buffer);
  if (mode == "hold-mapped") return HoldTwice(**client, **buffer);
  stash::StashArgs args;
  args.source = buffer->get();
  args.row_bytes = 1;
  args.max_rows = bytes;
  args.count.value = bytes;
  if (mode == "midstash") args.ready = {events->get(), 0, 1};
  auto ticket = (*client)->Stash(args);
  if (!ticket.ok()) return 1;
  if (mode == "hold") {
    auto done = (*client)->Wait(*ticket);
    if (!done.ok()) {
      std::fprintf(stderr, "%s\n", done.status().ToString().c_str());
      return 1;
    }
    std::printf("stashed %llu\n", static_cast<unsigned long long>(done->pages));
  } else {
    std::printf("queued\n");
  }
  std::fflush(stdout);
  while (true) pause();
}

// stash-test-client: a scripted client process for tests that kill clients.
//   stash-test-client SOCKET MODE BYTES
// MODE hold: stash BYTES and wait for the daemon's answer, print "stashed <pages>", then sleep.
// MODE midstash: queue a stash of BYTES whose ready event is never signalled, print "queued",
//   then sleep (the daemon holds the request, waiting for the event).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "stash/client.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: stash-test-client SOCKET hold|midstash BYTES\n");
    return 2;
  }
  const std::string mode = argv[2];
  const uint64_t bytes = std::strtoull(argv[3], nullptr, 10);
  stash::Options options;
  options.socket = argv[1];
  auto client = stash::Client::Open(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto buffer = stash::HostBuffer::Allocate(bytes);
  auto events = stash::HostBuffer::Allocate(4096);
  if (!buffer.ok() || !events.ok()) return 1;
  std::memset((*buffer)->data(), 0x5a, bytes);
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

#include "client/session/session_stream.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>

#include "client/session/tier_stats.h"
#include "common/socket_path.h"
#include "common/socket_probe.h"
#include "common/text.h"
#include "common/version.h"

namespace stash::client {
namespace {

// How long closing a session waits for the daemon to drain its copies before cancelling.
constexpr std::chrono::seconds kCloseDrainTimeout(10);

std::string NoDaemon(const std::string& socket, const std::string& detail) {
  return "no stashd answers on " + socket + " (" + detail +
         "): start it with 'stashd --socket=" + socket +
         "' or point STASHD_SOCKET at a running one";
}

}  // namespace

Tier FromProtoTier(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE:
      return Tier::kDevice;
    case v1::TIER_HOST:
      return Tier::kHost;
    case v1::TIER_OVERFLOW:
      return Tier::kOverflow;
    case v1::TIER_PEER:
      return Tier::kPeer;
    default:
      return Tier::kUnspecified;
  }
}

StatusOr<SessionStats> SessionStream::Stats() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse response;
  grpc::Status status = stub->GetStats(&ctx, v1::GetStatsRequest(), &response);
  if (!status.ok()) {
    return UnavailableError("stats from stashd on " + socket + ": " + status.error_message());
  }
  SessionStats out;
  out.session_id = welcome.session_id();
  out.pool = welcome.pool();
  out.page_bytes = welcome.page_bytes();
  for (const v1::TierStats& t : response.tiers()) AddTierStats(t, &out);
  for (const v1::SessionStats& s : response.sessions()) {
    if (s.session_id() != out.session_id) continue;
    out.stashes = s.stashes();
    out.reloads = s.reloads();
    out.releases = s.releases();
    out.bytes_stashed = s.bytes_stashed();
    out.bytes_reloaded = s.bytes_reloaded();
    out.spills = s.spills();
    out.overflows = s.overflows();
    out.rejected = s.rejected();
    out.stashes_live = s.stashes_live();
    out.pages_live = s.pages_live();
  }
  return out;
}

SessionStream::MemoryDesc SessionStream::HostMemory(const HostBuffer& buffer) {
  return MemoryDesc{buffer.id(), v1::MEMORY_KIND_HOST_FD, "", buffer.size(), buffer.rep().memory};
}

StatusOr<std::unique_ptr<SessionStream>> SessionStream::Open(const Options& options, v1::Mode mode,
                                                             std::shared_ptr<CudaSide> cuda) {
  auto stream = std::make_unique<SessionStream>();
  SessionStream* raw = stream.get();
  raw->backend = options.backend;
  raw->cuda = std::move(cuda);
  raw->socket = ClientSocketPath(options.socket);
  // A missing, refused or forbidden socket is known at once; gRPC would only say "unavailable"
  // once the connect timeout passed.
  STASH_RETURN_IF_ERROR(ProbeSocket(raw->socket));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  raw->channel = grpc::CreateCustomChannel(GrpcUnixTarget(raw->socket),
                                           grpc::InsecureChannelCredentials(), args);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  if (!raw->channel->WaitForConnected(deadline)) {
    return UnavailableError(NoDaemon(raw->socket, "connect timed out"));
  }
  raw->stub = v1::StashService::NewStub(raw->channel);

  raw->stub->async()->Session(&raw->context, raw);
  raw->StartRead(&raw->incoming);
  raw->AddHold();
  raw->StartCall();
  // From here Close() (the destructor) cleans up the stream whatever happens.
  raw->started = true;

  v1::SessionRequest hello;
  hello.set_request_id(RandomNonZeroU64());
  v1::Hello* h = hello.mutable_hello();
  h->set_rank(options.rank);
  h->set_device(options.device);
  h->set_backend(options.backend == Backend::kCuda ? v1::BACKEND_CUDA : v1::BACKEND_HOST);
  if (raw->cuda != nullptr) h->set_device_uuid(raw->cuda->uuid());
  h->set_pid(getpid());
  h->set_client_version(kVersion);
  h->set_label(options.label);
  h->set_allow_host_spill(options.allow_host_spill);
  h->set_mode(mode);
  h->set_group(options.group);  // Client::Open resolved them (ResolveGroup)
  h->set_group_secret(options.group_secret);
  const uint64_t hello_id = hello.request_id();

  bool start = false;
  {
    std::lock_guard<std::mutex> lock(raw->mu);
    Pending p;
    p.kind = Completion::Kind::kRegister;  // Hello: only `answered` and the Welcome matter
    raw->pending.emplace(hello_id, p);
    std::vector<v1::SessionRequest> batch;
    batch.push_back(std::move(hello));
    bool accepted = true;
    start = raw->QueueLocked(batch, &accepted);
  }
  if (start) raw->writes.Kick();

  std::unique_lock<std::mutex> lock(raw->mu);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  const bool settled =
      raw->cv.wait_until(lock, until, [&] { return raw->welcomed || raw->broken; });
  if (!settled) return UnavailableError(NoDaemon(raw->socket, "no answer to Hello"));
  if (!raw->welcomed) {
    // Refused: the stream's final status (delivered once our hold is gone) says why.
    raw->hold_removed = true;
    lock.unlock();
    raw->RemoveHold();
    lock.lock();
    raw->cv.wait(lock, [&] { return raw->done; });
    return raw->broken_status;
  }
  if (!raw->pending[hello_id].status.ok()) return raw->pending[hello_id].status;
  raw->pending.erase(hello_id);
  raw->descriptors = std::make_unique<DescriptorChannel>(raw->socket, raw->welcome.session_id(),
                                                         raw->welcome.descriptor_secret());
  lock.unlock();
  if (mode == v1::MODE_DAEMON_COPY) {
    raw->has_writer = true;
    raw->writer = std::thread([raw] { raw->WriterLoop(); });
  }
  return stream;
}

StatusOr<Completion> SessionStream::Wait(uint64_t op, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = pending.find(op);
  if (it == pending.end()) {
    return NotFoundError("operation " + std::to_string(op) +
                         " is not pending: unknown here, or its answer was already handed out");
  }
  auto ready = [&] {
    auto found = pending.find(op);
    return found == pending.end() || found->second.answered || broken;
  };
  // `op` still waits for the writer, and no write runs: this thread writes it (and what was
  // queued before it) instead of sleeping while the writer wakes up. Only as far as the queue
  // hands no memfd over: a write never blocks (gRPC queues it), a descriptor round trip could
  // outlast the caller's timeout. Nobody else takes from the queue meanwhile (this thread holds
  // mu or `writing`), so its front stays the next job up to `op`.
  const bool queued = std::any_of(outgoing.begin(), outgoing.end(),
                                  [&](const Outgoing& job) { return job.op == op; });
  if (queued && !writing && !ready()) {
    while (!outgoing.empty() && outgoing.front().deposits.empty()) {
      const uint64_t front = outgoing.front().op;
      WriteFront(lock);
      if (front == op) break;
    }
    // What this thread left (behind a memfd, or queued meanwhile) is the writer's: it may sleep
    // (it found `writing` set, or the submitter left it asleep: Writer::kCallerWaits), and a
    // stopping writer waits for `writing` to clear. With nothing left it sleeps on.
    if (writer_sleeping && (!outgoing.empty() || writer_stop)) writer_cv.notify_one();
  }
  if (timeout_ms < 0) {
    cv.wait(lock, ready);
  } else if (!cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return DeadlineExceededError("operation " + std::to_string(op) + " not answered within " +
                                 std::to_string(timeout_ms) + " ms");
  }
  it = pending.find(op);
  if (it == pending.end()) {
    return NotFoundError("operation " + std::to_string(op) +
                         " is not pending: its answer was handed to another waiter");
  }
  Pending p = std::move(it->second);
  pending.erase(it);
  if (!p.answered) {
    if (p.kind == Completion::Kind::kReload) {
      return UnavailableError(LostStash(p.ticket, broken_status.message()));
    }
    return broken_status;
  }
  if (!p.status.ok()) return p.status;
  return p.completion;
}

std::string SessionStream::LostStash(uint64_t ticket, const std::string& why) const {
  return "the rows of ticket " + Hex(ticket) + " are lost: they were stashed in session " +
         welcome.session_id() + " of stashd on " + socket +
         ", which went away (the daemon died, restarted or stopped) after the stash (" + why +
         "); nothing was written to the destination. Rerun the step with the stash off "
         "(stashd.torch.overflow_guard does); the next BeginStep reconnects";
}

SessionStream::~SessionStream() { Close(); }

void SessionStream::WriterLoop() {
  // SCHED_BATCH: a woken writer never preempts the thread that woke it, so on a busy core
  // Stash() returns before the write runs, not after. Same nice value; best effort.
  sched_param batch{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    if (!outgoing.empty() && !writing) {
      WriteFront(lock);
      continue;
    }
    if (writer_stop && outgoing.empty() && !writing) return;
    // Asleep with the flag set on every wait: a wake that finds nothing (a waiter took the
    // operation first, Wait) sleeps again with it set, so the next Submit wakes it.
    writer_sleeping = true;
    writer_cv.wait(lock);
    writer_sleeping = false;
  }
}

void SessionStream::WriteFront(std::unique_lock<std::mutex>& lock) {
  Outgoing job = std::move(outgoing.front());
  outgoing.pop_front();
  writing = true;
  lock.unlock();
  WriteOne(std::move(job));
  lock.lock();
  writing = false;
}

void SessionStream::WriteOne(Outgoing job) {
  // The memfds first, in submission order, outside the lock (a round trip to the daemon each).
  // A stream that broke takes nothing more: the operation stays unanswered, and Wait reports the
  // stream's end, as for an operation it dropped from its write queue.
  std::vector<std::pair<uint64_t, Status>> refused;
  for (const MemoryDesc& m : job.deposits) {
    if (broken_now()) return;
    bool gave_up = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      gave_up = std::chrono::steady_clock::now() > writer_give_up;
    }
    Status st = gave_up ? UnavailableError("stashd on " + socket +
                                           " did not take this buffer's memory within " +
                                           std::to_string(kCloseDrainTimeout.count()) +
                                           " s of the client's Close(): the operation was not sent")
                        : descriptors->DepositMemory(m.id, m.bytes, m.memory->fd());
    if (!st.ok()) refused.emplace_back(m.id, std::move(st));
  }
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (broken) return;
    for (const auto& [memory_id, why] : refused) {
      // Not registered after all: the next operation that names it hands it over again. The
      // operations queued meanwhile counted on this registration: they fail as this one does,
      // as each of them would have failed handing the same memfd over itself.
      registered.erase(memory_id);
      for (auto it = job.batch.begin(); it != job.batch.end(); ++it) {
        if (it->has_register_memory() && it->register_memory().memory_id() == memory_id) {
          pending.erase(it->request_id());
          job.batch.erase(it);
          break;
        }
      }
      if (job.failed.ok()) job.failed = why;
      for (Outgoing& later : outgoing) {
        if (!later.failed.ok()) continue;
        for (uint64_t named : later.memory_ids) {
          if (named == memory_id) later.failed = why;
        }
      }
    }
    if (!job.failed.ok()) {
      // Answered here with the reason; what else the batch carries (other registrations, stale
      // unregisters) still goes out, since later operations count on it.
      job.batch.pop_back();
      auto it = pending.find(job.op);
      if (it != pending.end()) {
        Pending& p = it->second;
        p.status = job.failed;
        p.answered = true;
        DoneAnsweredLocked(job.op, p);
        cv.notify_all();
      }
    }
    if (job.batch.empty()) return;
    bool accepted = true;
    start = QueueLocked(job.batch, &accepted);
    if (!accepted) {
      // The stream is gone.
      auto it = pending.find(job.op);
      if (it != pending.end() && !it->second.answered) {
        it->second.status = UnavailableError("stashd on " + socket + " went away");
        it->second.answered = true;
      }
      ReleaseDoneEventsLocked();
      cv.notify_all();
      return;
    }
  }
  if (start) writes.Kick();
}

void SessionStream::StopWriter() {
  {
    std::lock_guard<std::mutex> lock(mu);
    writer_stop = true;
    writer_give_up = std::chrono::steady_clock::now() + kCloseDrainTimeout;
  }
  writer_cv.notify_all();
  if (writer.joinable()) writer.join();
}

void SessionStream::Close() {
  if (!started || closed) return;
  closed = true;
  StopWriter();
  // A healthy session ends by a half-close: the daemon ends the stream only once every copy and
  // done write of the session finished, and only then does OnReadDone raise the pending done
  // counters. A cancel would raise them at once while the daemon's copies still run, and a done
  // write landing after that raise could lower a counter a stream waits on. Cancelled anyway
  // after kCloseDrainTimeout (a daemon that does not answer).
  bool healthy = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    healthy = !broken && welcomed;
  }
  const bool half_closed = healthy && writes.CloseAfterWrites([this] { StartWritesDone(); });
  if (half_closed) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, kCloseDrainTimeout, [&] { return broken; });
  }
  context.TryCancel();
  std::unique_lock<std::mutex> lock(mu);
  if (!hold_removed) {
    hold_removed = true;
    lock.unlock();
    RemoveHold();
    lock.lock();
  }
  cv.wait(lock, [&] { return done; });
}

}  // namespace stash::client

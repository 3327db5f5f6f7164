// The stashd client library: one session with the node's stash daemon.
//
// A training rank opens one Client and, for every marked activation (on the host backend its
// buffers are HostBuffers, memfds the daemon maps; on the cuda backend they are
// device pointers inside cudaMalloc allocations, which the daemon opens through CUDA IPC):
//
//   auto ticket = client->Stash(args);          // returns at once; the daemon copies
//   auto done = client->Wait(*ticket);          // the daemon confirmed: the source may be reused
//   ...backward...
//   auto op = client->Reload({*ticket, &dest, 0, /*zero_tail=*/true});
//   client->Wait(*op);                          // dest holds the rows again; pages returned
//
// A client keeps its activation until the daemon confirms the copy: on OVERFLOW nothing was
// taken and the caller keeps using its own buffer. When the daemon goes away, every pending and
// later call fails fast with UNAVAILABLE and a message naming the socket; the caller's buffers
// are never touched by the library. The next BeginStep reconnects once a daemon answers (both
// modes; attempts back off up to 1 s while none does). In daemon-copy mode the stashes the gone
// session held are lost: their Reload / Release fail at once with UNAVAILABLE naming the ticket
// and that the daemon went away after the stash (mapped mode loses nothing: the rank holds its
// chunks). While the daemon drains (stashctl drain), stashes are answered by the library
// itself as OVERFLOW (nothing taken) without setting the step's overflow flag, reloads of
// earlier stashes go on, and the session ends once its last stash is back; a later BeginStep
// opens a new one once a daemon takes sessions again (undrain, or a restart).
//
// On the cuda backend the copies are ordered on the GPU without the trainer's thread waiting:
// EnqueueSignal(ready, stream) after the kernels that wrote the activation, and
// EnqueueWait(done, stream) before the kernels that read a reloaded buffer
// (docs/cuda-backend.md).
//
// Mapped mode on the cuda backend (Options.mode = Mode::kMapped, Backend::kCuda): the library
// maps the leased chunks into this process and pages device buffers with its own kernels on the
// caller's stream (StashArgs::stream, ReloadArgs::stream, Release / BeginStep's stream): nothing
// waits on the host, no event is needed, and the calls may be captured in a CUDA graph. Whether
// a stash overflowed is known on the GPU only: see StashArgs::keep_source and the step flags.
//
// Thread safety: every method may be called from any thread at the same time. Only Wait (and
// Open, Stats) block; they block on the daemon's answer, never on another caller.
#ifndef STASH_CLIENT_H_
#define STASH_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "stash/export.h"
#include "stash/options.h"
#include "stash/status.h"

namespace stash {

namespace v1 {
class Welcome;  // stash.v1.Welcome (the library's own; no protobuf header here)
}  // namespace v1
namespace client {     // the library's internals (client/), apart from the API's names
class ModeSession;     // client/session/mode_session.h: the session of the mode Open picked
struct SessionStream;  // client/session/session_stream.h: one session's stream to the daemon
}  // namespace client

// Memory the daemon can read and write: a memfd this library created, sealed so its size never
// changes, which each session hands to the daemon as a file descriptor on first use (no name
// exists: no other process can open it, and nothing is left behind when the process dies).
// Not copyable; freeing it unmaps it here (a daemon that still has it
// registered keeps its own mapping until the client unregisters it or the session ends). A
// buffer whose counters a GPU stream raised or waited on (EnqueueSignal / EnqueueWait) stays
// mapped after it is freed, until the process exits: a stream may still wait on it (an
// exception path, a close before synchronize), and unmapping it then would fault the CUDA
// context. Allocate event buffers once per session, not per step.
class STASH_EXPORT HostBuffer {
 public:
  // Allocates `bytes` (> 0) bytes, zero-filled, 64-byte aligned (page aligned in fact).
  static StatusOr<std::unique_ptr<HostBuffer>> Allocate(uint64_t bytes);

  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  uint8_t* data() const;
  uint64_t size() const;
  // A process-unique id; the session registers the buffer under it on first use.
  uint64_t id() const;

  struct Rep;  // the library's own state

 private:
  friend class Client;
  friend struct client::SessionStream;
  Rep& rep() const { return *rep_; }
  explicit HostBuffer(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

// An event: an 8-byte counter inside a HostBuffer, "signalled" once it reaches a value. Counters
// only grow, so an event point is never "reused" while the other side still waits on it: each
// signal uses the next value. Host threads use SignalEvent / WaitEvent; GPU streams use
// Client::EnqueueSignal / EnqueueWait (cuda backend). The daemon polls ready events from its CPU
// and raises done events itself (on the cuda backend from its copy stream).
struct EventPoint {
  const HostBuffer* buffer = nullptr;  // null = no event
  uint64_t offset = 0;                 // 8-byte aligned
  uint64_t value = 0;
};
// Raises the counter to point.value and wakes waiters in every process.
STASH_EXPORT void SignalEvent(const EventPoint& point);
// Blocks until the counter reaches point.value or `timeout_ms` passes (-1 = forever).
STASH_EXPORT bool WaitEvent(const EventPoint& point, int64_t timeout_ms);

// How many rows of a stashed buffer are valid.
struct RowCount {
  // Either a value known now...
  uint64_t value = 0;
  // ...or, when `buffer` is set, a little-endian int64 at buffer + offset, read by the daemon
  // only when the copy runs (after `ready`): the sync-free case.
  const HostBuffer* buffer = nullptr;
  uint64_t offset = 0;
  // rows = ceil(count / divisor): 1 for data, 32 for MXFP8 columnwise scale_inv.
  uint32_t divisor = 1;
  // ...or (cuda backend), an int64 in GPU memory at this device pointer (8-byte aligned), read
  // by the daemon's copy kernel on the GPU: the routing count never comes to the host. Like the
  // source, it must stay unchanged until the stash is answered.
  const void* device_count = nullptr;
};

struct StashArgs {
  // Row 0 at source->data() + offset; or set device_source (below) instead.
  const HostBuffer* source = nullptr;
  uint64_t offset = 0;
  uint64_t row_bytes = 0;  // > 0
  uint64_t max_rows = 0;   // > 0; [offset, offset + max_rows * row_bytes) must fit the memory
  RowCount count;
  EventPoint ready;  // the daemon copies only after this; default: ready now
  EventPoint done;   // signalled by the daemon after the copy; default: none
  // Tags for stats and logs.
  uint32_t layer = 0;
  uint32_t microbatch = 0;
  std::string name;
  // Cuda backend, instead of `source`: row 0 at device_source + offset, a pointer inside a
  // cudaMalloc allocation of the session's GPU (a tensor's data_ptr(); PyTorch's caching
  // allocator is fine, its expandable_segments is not). Exactly one of the two is set.
  // Mapped mode on the cuda backend: any device memory this GPU reaches (expandable_segments
  // too: nothing is exported).
  const void* device_source = nullptr;
  // Mapped mode on the cuda backend: the stream (a CUstream / cudaStream_t; null = the legacy
  // default stream) the stash is enqueued on, after the kernels that wrote the activation (the
  // stream orders it: ready and done stay unset). Other modes refuse it.
  void* stream = nullptr;
  // Mapped mode on the cuda backend. true (the default): the source stays valid and unchanged
  // until the stash's reload or release ran, so a stash that overflowed (only the GPU knows) is
  // reloaded from it, also in every replay of a graph. false: the source may be freed once the
  // stash is enqueued (the memory saving); a stash that overflowed then leaves the reload's
  // destination as it was and flags the step (CurrentStepFlags().overflow): rerun it. Other
  // modes keep the source until the stash is answered either way.
  bool keep_source = true;
};

// Where a stash went.
enum class Tier { kUnspecified = 0, kDevice = 1, kHost = 2, kOverflow = 3, kPeer = 4 };
STASH_EXPORT const char* TierName(Tier tier);

struct ReloadArgs {
  uint64_t ticket = 0;
  // Must hold max_rows * row_bytes of the stash; or set device_destination (below) instead.
  const HostBuffer* destination = nullptr;
  uint64_t offset = 0;
  bool zero_tail = false;  // write zeros to rows [rows, max_rows)
  EventPoint ready;        // the daemon writes only after this; default: now
  EventPoint done;         // signalled after the copy; default: none
  // Cuda backend, instead of `destination`: a device pointer, like StashArgs::device_source.
  void* device_destination = nullptr;
  // Mapped mode on the cuda backend: the stream the reload is enqueued on, before the kernels
  // that read the destination (like StashArgs::stream). Other modes refuse it.
  void* stream = nullptr;
};

// The daemon's answer to one operation.
struct Completion {
  enum class Kind { kStash, kReload, kRelease, kBeginStep, kRegister, kUnregister };
  Kind kind = Kind::kStash;
  uint64_t ticket = 0;             // stash, reload, release
  Tier tier = Tier::kUnspecified;  // stash: where it went (kOverflow: nothing taken); reload: from
  uint64_t rows = 0;               // stash, reload: valid rows
  uint64_t bytes = 0;              // stash, reload: payload bytes copied
  uint64_t pages = 0;              // stash: pages held; release: pages returned
  uint64_t latency_us = 0;         // stash, reload: receipt to copy done, in the daemon
  bool step_overflow = false;      // begin_step: the previous step's flags
  bool step_spilled = false;
};

struct StepFlags {
  bool overflow = false;  // a stash of this step overflowed (its source stayed with the caller)
  bool spilled = false;   // a stash of this step went outside its own pool (host tier or a peer's)
  // Daemon-copy: the session broke (the daemon died, restarted or stopped) while it held stashes
  // of this step or before: their reloads fail UNAVAILABLE, so rerun the step (the next
  // BeginStep reconnects). Mapped mode never loses a stash this way (the rank holds its chunks).
  bool lost = false;
};

// A snapshot of the daemon's view of this session and its pool.
struct SessionStats {
  std::string session_id;
  int pool = 0;
  uint64_t page_bytes = 0;
  uint64_t pool_pages_total = 0, pool_pages_used = 0, pool_pages_high_water = 0;
  uint64_t host_pages_total = 0, host_pages_used = 0, host_pages_high_water = 0;
  uint64_t stashes = 0, reloads = 0, releases = 0;
  uint64_t bytes_stashed = 0, bytes_reloaded = 0;
  uint64_t spills = 0, overflows = 0, rejected = 0;
  uint64_t stashes_live = 0, pages_live = 0;
};

class STASH_EXPORT Client {
 public:
  // Connects (socket from options, $STASHD_SOCKET, or the default) and says Hello.
  // UNAVAILABLE when no daemon answers (the message names the socket and how to start one): at
  // once when the socket is missing or refuses (its daemon is gone), else after
  // Options::connect_timeout_ms; PERMISSION_DENIED at once when this user may not use the socket
  // (the message names its group and how to join it);
  // FAILED_PRECONDITION / INVALID_ARGUMENT when the daemon refuses the Hello (other backend,
  // device out of range, a malformed group name).
  // Groups (Options.group, or $STASHD_GROUP): INVALID_ARGUMENT at once, before connecting, for a
  // group without a secret or the reverse, or a secret of the wrong size (the message names the
  // option or the variable); PERMISSION_DENIED when the daemon refuses the join (the group
  // belongs to another Unix user, or its first member set another secret).
  // Mapped mode (Options.mode = Mode::kMapped) also takes the first lease here:
  // FAILED_PRECONDITION from a daemon that leases no chunks (and, on the cuda backend, without
  // the NVIDIA driver or VMM support); the daemon's refusal of the lease (RESOURCE_EXHAUSTED over
  // --max-lease-bytes, with the numbers). A mapped client pages into its leased chunks on its own
  // in-order copier thread: Stash/Reload/Release/BeginStep are answered by it with the daemon's
  // codes and words; a stash that does not fit the lease is OVERFLOW. If the daemon dies, the
  // chunks held stay valid (stashes made reload, the step finishes) and the first BeginStep with no
  // stash live reconnects and leases afresh.
  static StatusOr<std::unique_ptr<Client>> Open(const Options& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  // Ends the session: the daemon drops queued work and returns every page this session holds.
  // Mapped mode: runs the queued operations first, unmaps every leased chunk and gives them back.
  ~Client();

  // Queues a stash and returns its ticket at once. Buffers named for the first time are
  // registered with the daemon first (pipelined; in daemon-copy mode the session's own thread
  // hands them over and writes the request). INVALID_ARGUMENT for arguments that cannot be
  // sent; UNAVAILABLE when the daemon is known to be gone. Errors found later come from Wait:
  // the daemon's, and a buffer that could not be handed over (the descriptor channel's words).
  StatusOr<uint64_t> Stash(const StashArgs& args);

  // Queues a reload; returns the operation id to Wait on.
  StatusOr<uint64_t> Reload(const ReloadArgs& args);
  // Stash(args), then Wait(ticket, timeout_ms), as one call, for a caller that waits at once
  // anyway (the Python binding's wait=True): in daemon-copy mode the calling thread writes the
  // request itself instead of waking the session's own thread, the shortest round trip
  // (docs/benchmarks.md §2). The answer, or the error Stash or Wait gives. `ticket` (when set)
  // receives the ticket once the stash is queued, also when the wait then fails: after
  // DEADLINE_EXCEEDED the stash is still in flight, Wait on it again (or Release it once
  // answered). Completion::ticket names it otherwise.
  StatusOr<Completion> StashAndWait(const StashArgs& args, int64_t timeout_ms = -1,
                                    uint64_t* ticket = nullptr);
  // Reload(args), then Wait, as one call (as StashAndWait); `op` (when set) receives the
  // operation id once queued.
  StatusOr<Completion> ReloadAndWait(const ReloadArgs& args, int64_t timeout_ms = -1,
                                     uint64_t* op = nullptr);
  // Queues dropping a stash without copying it back; returns the operation id. `stream`: mapped
  // mode on the cuda backend (like StashArgs::stream), refused elsewhere.
  StatusOr<uint64_t> Release(uint64_t ticket, void* stream = nullptr);
  // Queues a new step: clears the step flags (here at once, in the daemon in queue order).
  // Mapped mode on the cuda backend: the lease changes (outside capture) and the step kernel are
  // enqueued on `stream`; refused elsewhere.
  StatusOr<uint64_t> BeginStep(uint64_t step, void* stream = nullptr);
  // Mapped mode on the cuda backend: every CUDA graph that captured this client's stashes,
  // reloads or releases has been destroyed (cuGraphExecDestroy and cuGraphDestroy, or
  // torch.cuda.CUDAGraph.reset()). A captured stash's plan slot stays taken while a graph may
  // replay it (4,096 slots in all), so a job that captures again and again calls this after it
  // destroyed the old graphs; calling it while one may still replay lets two stashes share a
  // slot. FAILED_PRECONDITION in the other modes (nothing is captured there), and while a stash
  // taken during a capture is not reloaded or released yet (a graph may still replay it).
  Status GraphsDestroyed();
  // Tells the daemon to close its mapping of `buffer` before the caller frees it.
  StatusOr<uint64_t> Unregister(const HostBuffer& buffer);
  // Cuda backend: the same for the cudaMalloc allocation holding `pointer`. Wait for its answer
  // before freeing the allocation (e.g. before torch.cuda.empty_cache()): the daemon answers once
  // its IPC mapping is closed, and CUDA forbids freeing exported memory an importer still has
  // open. Allocations the library later finds in a freed one's address range are unregistered
  // by themselves.
  StatusOr<uint64_t> UnregisterDevice(const void* pointer);

  // Cuda backend: closes the daemon's mappings of every allocation this session registered and
  // waits (up to `timeout_ms`, -1 = forever) until they are closed; the next stash or reload
  // that names one registers it again. Call it before giving cached GPU memory back to the
  // driver (torch.cuda.empty_cache()), which cannot free memory the daemon still has open.
  // Work in flight finishes first. OK with nothing to do on the host backend.
  Status ReleaseDeviceMappings(int64_t timeout_ms = -1);

  // Cuda backend: enqueues on `stream` (a cudaStream_t; null = the legacy default stream) the
  // signal of `point`: its counter becomes point.value once the stream's earlier work is done.
  // Use it as a stash's `ready` so the daemon copies only what the kernels before it wrote.
  // The first use of a HostBuffer here maps it for the GPU (cuMemHostRegister).
  Status EnqueueSignal(const EventPoint& point, void* stream);
  // Cuda backend: makes `stream`'s later work wait until `point`'s counter reaches point.value:
  // pass a reload's `done` so kernels after it read the reloaded rows. The trainer's thread
  // never blocks.
  Status EnqueueWait(const EventPoint& point, void* stream);

  // Blocks until operation `op` (a ticket from Stash, or an id from the others) is answered, or
  // `timeout_ms` passes (-1 = forever: DEADLINE_EXCEEDED otherwise). Returns the daemon's
  // answer or its error status; each answer is handed out once (NOT_FOUND after that).
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms = -1);
  // Like Wait but never blocks: nullopt while the operation is in flight.
  std::optional<StatusOr<Completion>> Poll(uint64_t op);

  // The flags of the current step, as far as answers have arrived. Mapped mode on the cuda
  // backend: as far as the GPU got (synchronize the stream first to have the whole step's).
  StepFlags CurrentStepFlags() const;

  // Asks the daemon for the live session's counters and its pool usage (a unary RPC): after a
  // reconnect, the new session's. UNAVAILABLE while the session is gone (the daemon died: the
  // next BeginStep reconnects) or none is open (drained), with the reason.
  StatusOr<SessionStats> Stats();

  // The session id the daemon gave, and the pool geometry from its Welcome: of the live session,
  // in both modes, so they change when the client reconnects (a daemon that died, restarted or
  // drained; returned by value for that reason). While a drained client holds no session they
  // describe the last one.
  std::string session_id() const;
  uint64_t page_bytes() const;
  uint64_t pool_pages() const;
  uint64_t host_tier_pages() const;
  const std::string& socket() const;
  Backend backend() const;
  Mode mode() const;

 private:
  Client() = default;
  // The live session's Welcome, whichever mode holds it.
  v1::Welcome welcome() const;
  // Stash and Reload; `then_wait`: the caller Waits for the operation next (the *AndWait calls),
  // so in daemon-copy mode its Wait writes the request and the session's thread sleeps on.
  StatusOr<uint64_t> Queue(const StashArgs& args, bool then_wait);
  StatusOr<uint64_t> Queue(const ReloadArgs& args, bool then_wait);
  // The session of the mode this client was opened in (daemon-copy, mapped on the host, mapped
  // on the cuda backend): every public method calls it; nothing else looks at the mode.
  std::unique_ptr<client::ModeSession> session_;
};

}  // namespace stash

#endif  // STASH_CLIENT_H_

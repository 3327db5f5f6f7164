/* The C ABI of libstash_client.so: the same operations as stash/client.h, for Python (ctypes)
 * and other languages.
 *
 * Conventions: functions return 0 on success or a status code (the numbers of stash::StatusCode
 * and google.rpc.Code: 3 INVALID_ARGUMENT, 5 NOT_FOUND, 14 UNAVAILABLE, ...); the message of the
 * last failure on the calling thread is stash_last_error(). Handles are opaque; every *_open /
 * *_alloc has its *_close / *_free. All functions are thread-safe.
 */
#ifndef STASH_C_API_H_
#define STASH_C_API_H_

/* A C header: C++ modernizations do not apply. */
/* NOLINTBEGIN(modernize-use-using, modernize-deprecated-headers) */

#include <stdint.h>

#include "stash/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stash_client stash_client_t;
typedef struct stash_buffer stash_buffer_t;

/* The daemon's backend (stash_client_open). */
enum { STASH_BACKEND_HOST = 0, STASH_BACKEND_CUDA = 1 };

/* Where a stash went (stash_completion_t.tier). */
enum { STASH_TIER_DEVICE = 1, STASH_TIER_HOST = 2, STASH_TIER_OVERFLOW = 3, STASH_TIER_PEER = 4 };

/* Who runs the copies (stash_open_options_t.mode; stash::Mode). */
enum { STASH_MODE_DAEMON_COPY = 0, STASH_MODE_MAPPED = 1 };

/* The message of the last failing call on this thread ("" when none). Valid until the next
 * failing call on this thread. */
STASH_EXPORT const char* stash_last_error(void);
/* The library version, e.g. "0.1.0". */
STASH_EXPORT const char* stash_version(void);

/* Opens a session. socket: NULL or "" = $STASHD_SOCKET or the default. backend:
 * STASH_BACKEND_*. device: the simulated GPU on the host backend, the CUDA ordinal on the cuda
 * backend. rank: -1 = unknown. label: may be NULL. */
STASH_EXPORT int stash_client_open(const char* socket, int backend, int device, int64_t rank,
                                   const char* label, int allow_host_spill,
                                   int64_t connect_timeout_ms, stash_client_t** out);
/* Everything stash_client_open takes, and the mode and lease (stash::Options). Fill it with
 * stash_open_options_init first, then set what differs. */
typedef struct stash_open_options {
  const char* socket;         /* NULL or "" = $STASHD_SOCKET or the default */
  int backend;                /* STASH_BACKEND_*; default host */
  int device;                 /* default 0 */
  int64_t rank;               /* -1 = unknown (default) */
  const char* label;          /* may be NULL */
  int allow_host_spill;       /* default 1 */
  int64_t connect_timeout_ms; /* <= 0 = the default, 5000 */
  int mode;                   /* STASH_MODE_*; default daemon-copy */
  /* Mapped mode: 1 (default) = the daemon sizes the lease at each step; 0 = these bytes. */
  int lease_automatic;
  uint64_t lease_device_bytes;
  uint64_t lease_peer_bytes;
  uint64_t lease_host_bytes;
  uint32_t copy_threads; /* mapped mode: threads splitting one copy; 0 = the default, 2 */
} stash_open_options_t;

/* The defaults of stash::Options. */
STASH_EXPORT void stash_open_options_init(stash_open_options_t* options);
/* Opens a session with `options` (stash::Client::Open). */
STASH_EXPORT int stash_client_open_ex(const stash_open_options_t* options, stash_client_t** out);
/* stash_client_open_ex in a group of sessions (stash::Options.group, .group_secret; a function of
 * its own so that stash_open_options_t keeps its size for callers built before groups).
 * group: NULL or "" = no group, then group_secret_bytes must be 0 and $STASHD_GROUP /
 * $STASHD_GROUP_SECRET apply as for stash_client_open_ex. Otherwise 1-128 bytes of
 * A-Z a-z 0-9 . _ : @ + - and group_secret points at exactly 32 bytes (any values; they are
 * copied). INVALID_ARGUMENT for a group without a secret or the reverse; PERMISSION_DENIED when
 * the daemon refuses the join (another Unix user's group, or another secret). */
STASH_EXPORT int stash_client_open_group(const stash_open_options_t* options, const char* group,
                                         const void* group_secret, uint64_t group_secret_bytes,
                                         stash_client_t** out);

/* Ends the session; the daemon returns its pages. NULL is fine. */
STASH_EXPORT void stash_client_close(stash_client_t* client);

/* Shared memory the daemon can open (host backend). */
STASH_EXPORT int stash_buffer_alloc(uint64_t bytes, stash_buffer_t** out);
STASH_EXPORT void stash_buffer_free(stash_buffer_t* buffer);
STASH_EXPORT void* stash_buffer_data(const stash_buffer_t* buffer);
STASH_EXPORT uint64_t stash_buffer_size(const stash_buffer_t* buffer);

/* Events: an 8-byte counter at buffer + offset that is signalled once it reaches value. */
STASH_EXPORT void stash_event_signal(stash_buffer_t* buffer, uint64_t offset, uint64_t value);
/* 1 when reached, 0 on timeout (timeout_ms -1 = forever). */
STASH_EXPORT int stash_event_wait(stash_buffer_t* buffer, uint64_t offset, uint64_t value,
                                  int64_t timeout_ms);

typedef struct stash_stash_args {
  stash_buffer_t* source; /* this or device_source */
  uint64_t offset;
  uint64_t row_bytes;
  uint64_t max_rows;
  uint64_t count_value;         /* used when count_buffer is NULL */
  stash_buffer_t* count_buffer; /* int64 at count_buffer + count_offset, read at copy time */
  uint64_t count_offset;
  uint32_t divisor; /* 0 or 1: data; 32: MXFP8 columnwise scale_inv */
  uint32_t layer;
  uint32_t microbatch;
  uint32_t reserved;
  stash_buffer_t* ready_buffer; /* NULL = ready now */
  uint64_t ready_offset;
  uint64_t ready_value;
  const char* name;          /* may be NULL */
  const void* device_source; /* cuda backend, instead of source: a device pointer (row 0 at
                                device_source + offset) inside a cudaMalloc allocation */
  const void* device_count;  /* cuda backend, instead of count_value / count_buffer: an
                                8-byte aligned int64 in device memory, read by the copy */
} stash_stash_args_t;

typedef struct stash_completion {
  uint64_t ticket;
  int32_t tier; /* STASH_TIER_* for stash and reload, 0 otherwise */
  int32_t reserved;
  uint64_t rows;
  uint64_t bytes;
  uint64_t pages;
  uint64_t latency_us;
  int32_t step_overflow; /* begin_step: the previous step's flags */
  int32_t step_spilled;
} stash_completion_t;

/* Queues a stash; *ticket is its name and the operation to wait on. */
STASH_EXPORT int stash_stash(stash_client_t* client, const stash_stash_args_t* args,
                             uint64_t* ticket);
/* Queues a reload into destination + offset (must hold max_rows rows). */
STASH_EXPORT int stash_reload(stash_client_t* client, uint64_t ticket, stash_buffer_t* destination,
                              uint64_t offset, int zero_tail, uint64_t* op);
/* stash_stash then stash_wait as one call, for a caller that waits at once anyway: in
 * daemon-copy mode the calling thread writes the request itself, the shortest round trip
 * (stash::Client::StashAndWait). *ticket (when not NULL) is set once the stash is queued, also
 * when the wait then fails: after DEADLINE_EXCEEDED wait on it again. */
STASH_EXPORT int stash_stash_wait(stash_client_t* client, const stash_stash_args_t* args,
                                  int64_t timeout_ms, uint64_t* ticket, stash_completion_t* out);
/* stash_reload then stash_wait as one call (as stash_stash_wait). */
STASH_EXPORT int stash_reload_wait(stash_client_t* client, uint64_t ticket,
                                   stash_buffer_t* destination, uint64_t offset, int zero_tail,
                                   int64_t timeout_ms, uint64_t* op, stash_completion_t* out);
/* Cuda backend: queues a reload into device memory. ready (NULL buffer = now): the daemon writes
 * only after this event; done (NULL buffer = none): raised after the copy, for
 * stash_enqueue_wait. */
STASH_EXPORT int stash_reload_device(stash_client_t* client, uint64_t ticket, void* destination,
                                     int zero_tail, stash_buffer_t* ready_buffer,
                                     uint64_t ready_offset, uint64_t ready_value,
                                     stash_buffer_t* done_buffer, uint64_t done_offset,
                                     uint64_t done_value, uint64_t* op);
/* Mapped mode on the cuda backend (stash_open_options_t.mode = STASH_MODE_MAPPED, backend
 * cuda): the library pages device memory into its leased chunks with its own kernels, enqueued
 * on stream (a cudaStream_t; NULL = the legacy default stream) in order with the caller's
 * kernels: no event, no wait on the host, and the calls may be captured in a CUDA graph. The
 * answers (stash_wait / stash_poll) come at once and say what was enqueued; the GPU alone knows
 * whether a stash fitted. keep_source 1: an overflowed stash is reloaded from its source, which
 * must stay unchanged until its reload or release; 0: the source may be reused once the stream
 * passes the stash, and an overflowed stash's reload leaves the destination as it was and sets
 * the step's overflow flag: synchronize the stream, then read stash_step_flags, before the next
 * stash_begin_step_on_stream (which starts a step without flags): rerun that step.
 * begin_step_on_stream is also where the lease grows and shrinks (outside capture).
 * The rules: every operation of one session runs one after another on the GPU (one stream, or
 * streams the caller orders with events); stream must be a valid stream of the session's
 * device's primary context, and the pointers valid device memory of that device: the kernels
 * read and write them, and a bad one faults the caller's context as any kernel's would.
 * In the other modes these calls are FAILED_PRECONDITION. */
STASH_EXPORT int stash_stash_on_stream(stash_client_t* client, const stash_stash_args_t* args,
                                       int keep_source, void* stream, uint64_t* ticket);
STASH_EXPORT int stash_reload_on_stream(stash_client_t* client, uint64_t ticket, void* destination,
                                        int zero_tail, void* stream, uint64_t* op);
STASH_EXPORT int stash_release_on_stream(stash_client_t* client, uint64_t ticket, void* stream,
                                         uint64_t* op);
STASH_EXPORT int stash_begin_step_on_stream(stash_client_t* client, uint64_t step, void* stream,
                                            uint64_t* op);
/* Mapped mode on the cuda backend: every CUDA graph that captured this client's operations has
 * been destroyed; the plan slots kept for their replays come back (stash::Client::
 * GraphsDestroyed). FAILED_PRECONDITION in the other modes. */
STASH_EXPORT int stash_graphs_destroyed(stash_client_t* client);
/* Cuda backend: enqueue on stream (a cudaStream_t; NULL = the legacy default stream) raising
 * the event at buffer + offset to value after the stream's earlier work, or a wait until it
 * reaches value before the stream's later work. */
STASH_EXPORT int stash_enqueue_signal(stash_client_t* client, stash_buffer_t* buffer,
                                      uint64_t offset, uint64_t value, void* stream);
STASH_EXPORT int stash_enqueue_wait(stash_client_t* client, stash_buffer_t* buffer, uint64_t offset,
                                    uint64_t value, void* stream);
/* Cuda backend: the daemon closes every allocation of this session it has open, and this call
 * waits for that (timeout_ms -1 = forever); 0 at once on the host backend. Before
 * torch.cuda.empty_cache(). */
STASH_EXPORT int stash_release_device_mappings(stash_client_t* client, int64_t timeout_ms);
/* Cuda backend: the daemon closes the allocation holding pointer (before it is freed). */
STASH_EXPORT int stash_unregister_device(stash_client_t* client, const void* pointer, uint64_t* op);
STASH_EXPORT int stash_release(stash_client_t* client, uint64_t ticket, uint64_t* op);
STASH_EXPORT int stash_begin_step(stash_client_t* client, uint64_t step, uint64_t* op);
/* Blocks until op is answered (timeout_ms -1 = forever). Returns the daemon's status code. */
STASH_EXPORT int stash_wait(stash_client_t* client, uint64_t op, int64_t timeout_ms,
                            stash_completion_t* out);
/* Like stash_wait without blocking: returns -1 while op is in flight. */
STASH_EXPORT int stash_poll(stash_client_t* client, uint64_t op, stash_completion_t* out);
STASH_EXPORT int stash_step_flags(stash_client_t* client, int* overflow, int* spilled);
/* *lost = 1 when the session broke holding stashes of the current step or before (daemon-copy:
 * the daemon died, restarted or stopped; their reloads fail UNAVAILABLE: rerun the step; the
 * next stash_begin_step reconnects). Always 0 in mapped mode. */
STASH_EXPORT int stash_step_lost(stash_client_t* client, int* lost);

typedef struct stash_stats {
  uint64_t page_bytes;
  uint64_t pool_pages_total, pool_pages_used, pool_pages_high_water;
  uint64_t host_pages_total, host_pages_used, host_pages_high_water;
  uint64_t stashes, reloads, releases;
  uint64_t bytes_stashed, bytes_reloaded;
  uint64_t spills, overflows, rejected;
  uint64_t stashes_live, pages_live;
} stash_stats_t;
STASH_EXPORT int stash_get_stats(stash_client_t* client, stash_stats_t* out);

/* The live session: its id (NUL-terminated) and the pool geometry of its Welcome. After a
 * reconnect (a daemon that died, restarted or drained; both modes) the new session's; while a
 * drained client holds none, the last one's. Answered here, no round trip. */
typedef struct stash_session_info {
  char session_id[64];
  uint64_t page_bytes, pool_pages, host_tier_pages;
} stash_session_info_t;
STASH_EXPORT int stash_get_session(stash_client_t* client, stash_session_info_t* out);

#ifdef __cplusplus
}
#endif

/* NOLINTEND(modernize-use-using, modernize-deprecated-headers) */

#endif /* STASH_C_API_H_ */

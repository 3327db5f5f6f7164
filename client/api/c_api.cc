// The C ABI over stash::Client (stash/c_api.h).
#include "stash/c_api.h"

#include <cstring>
#include <memory>
#include <string>

#include "common/version.h"
#include "stash/client.h"

struct stash_client {
  std::unique_ptr<stash::Client> client;
};
struct stash_buffer {
  std::unique_ptr<stash::HostBuffer> buffer;
};

namespace {

thread_local std::string g_last_error;

int Fail(const stash::Status& status) {
  g_last_error = status.ToString();
  return static_cast<int>(status.code());
}

int Fail(stash::StatusCode code, const std::string& message) {
  return Fail(stash::Status(code, message));
}

void Fill(const stash::Completion& c, stash_completion_t* out) {
  if (out == nullptr) return;
  std::memset(out, 0, sizeof(*out));
  out->ticket = c.ticket;
  out->tier = static_cast<int32_t>(c.tier);
  out->rows = c.rows;
  out->bytes = c.bytes;
  out->pages = c.pages;
  out->latency_us = c.latency_us;
  out->step_overflow = c.step_overflow ? 1 : 0;
  out->step_spilled = c.step_spilled ? 1 : 0;
}

stash::StashArgs StashArgsOf(const stash_stash_args_t* args) {
  stash::StashArgs a;
  a.source = args->source != nullptr ? args->source->buffer.get() : nullptr;
  a.device_source = args->device_source;
  a.count.device_count = args->device_count;
  a.offset = args->offset;
  a.row_bytes = args->row_bytes;
  a.max_rows = args->max_rows;
  a.count.value = args->count_value;
  a.count.buffer = args->count_buffer != nullptr ? args->count_buffer->buffer.get() : nullptr;
  a.count.offset = args->count_offset;
  a.count.divisor = args->divisor == 0 ? 1 : args->divisor;
  if (args->ready_buffer != nullptr) {
    a.ready = {args->ready_buffer->buffer.get(), args->ready_offset, args->ready_value};
  }
  a.layer = args->layer;
  a.microbatch = args->microbatch;
  if (args->name != nullptr) a.name = args->name;
  return a;
}

// A reload into a shared-memory buffer (stash_reload, stash_reload_wait).
stash::ReloadArgs HostReloadArgs(uint64_t ticket, stash_buffer_t* destination, uint64_t offset,
                                 int zero_tail) {
  stash::ReloadArgs a;
  a.ticket = ticket;
  a.destination = destination->buffer.get();
  a.offset = offset;
  a.zero_tail = zero_tail != 0;
  return a;
}

int Stash(stash_client_t* client, const stash::StashArgs& a, uint64_t* ticket) {
  auto t = client->client->Stash(a);
  if (!t.ok()) return Fail(t.status());
  *ticket = *t;
  return 0;
}

// The *_on_stream calls are mapped mode on the cuda backend's: elsewhere a NULL stream would
// read as "no stream" and the call would run unordered with the caller's kernels.
bool OnStream(const stash_client_t* client) {
  return client->client->mode() == stash::Mode::kMapped &&
         client->client->backend() == stash::Backend::kCuda;
}

#define STASH_C_REQUIRE_ON_STREAM(client, call)                                            \
  if (!OnStream(client)) {                                                                 \
    return Fail(stash::StatusCode::kFailedPrecondition, call                               \
                ": the session is not in mapped mode on the cuda backend (open it with "   \
                "mode STASH_MODE_MAPPED and STASH_BACKEND_CUDA), or use the call without " \
                "_on_stream");                                                             \
  }

int Answer(const stash::StatusOr<uint64_t>& id, uint64_t* op) {
  if (!id.ok()) return Fail(id.status());
  *op = *id;
  return 0;
}

int Answer(const stash::StatusOr<stash::Completion>& c, stash_completion_t* out) {
  if (!c.ok()) return Fail(c.status());
  Fill(*c, out);
  return 0;
}

#define STASH_C_REQUIRE(cond, what) \
  if (!(cond)) return Fail(stash::StatusCode::kInvalidArgument, what)

}  // namespace

extern "C" {

const char* stash_last_error(void) { return g_last_error.c_str(); }
const char* stash_version(void) { return stash::kVersion; }

int stash_client_open(const char* socket, int backend, int device, int64_t rank, const char* label,
                      int allow_host_spill, int64_t connect_timeout_ms, stash_client_t** out) {
  STASH_C_REQUIRE(out != nullptr, "stash_client_open: out is NULL");
  STASH_C_REQUIRE(backend == STASH_BACKEND_HOST || backend == STASH_BACKEND_CUDA,
                  "stash_client_open: backend must be STASH_BACKEND_HOST (0) or "
                  "STASH_BACKEND_CUDA (1), not " +
                      std::to_string(backend));
  stash::Options options;
  options.backend = backend == STASH_BACKEND_CUDA ? stash::Backend::kCuda : stash::Backend::kHost;
  options.socket = socket != nullptr ? socket : "";
  options.device = device;
  options.rank = rank;
  options.label = label != nullptr ? label : "";
  options.allow_host_spill = allow_host_spill != 0;
  if (connect_timeout_ms > 0) options.connect_timeout_ms = connect_timeout_ms;
  auto client = stash::Client::Open(options);
  if (!client.ok()) return Fail(client.status());
  *out = new stash_client{std::move(client).value()};
  return 0;
}

void stash_open_options_init(stash_open_options_t* options) {
  if (options == nullptr) return;
  *options = stash_open_options_t{};
  const stash::Options defaults;
  options->backend = STASH_BACKEND_HOST;
  options->rank = defaults.rank;
  options->allow_host_spill = defaults.allow_host_spill ? 1 : 0;
  options->connect_timeout_ms = defaults.connect_timeout_ms;
  options->mode = STASH_MODE_DAEMON_COPY;
  options->lease_automatic = defaults.lease.automatic ? 1 : 0;
  options->copy_threads = defaults.copy_threads;
}

namespace {

// stash_client_open_ex and stash_client_open_group: `options` plus the group, opened.
// `fn` names the caller in messages.
int OpenWithOptions(const char* fn, const stash_open_options_t* in, stash::Options options,
                    stash_client_t** out) {
  STASH_C_REQUIRE(in != nullptr && out != nullptr, std::string(fn) + ": options or out is NULL");
  STASH_C_REQUIRE(in->backend == STASH_BACKEND_HOST || in->backend == STASH_BACKEND_CUDA,
                  std::string(fn) +
                      ": backend must be STASH_BACKEND_HOST (0) or "
                      "STASH_BACKEND_CUDA (1), not " +
                      std::to_string(in->backend));
  STASH_C_REQUIRE(in->mode == STASH_MODE_DAEMON_COPY || in->mode == STASH_MODE_MAPPED,
                  std::string(fn) +
                      ": mode must be STASH_MODE_DAEMON_COPY (0) or "
                      "STASH_MODE_MAPPED (1), not " +
                      std::to_string(in->mode));
  options.backend =
      in->backend == STASH_BACKEND_CUDA ? stash::Backend::kCuda : stash::Backend::kHost;
  options.socket = in->socket != nullptr ? in->socket : "";
  options.device = in->device;
  options.rank = in->rank;
  options.label = in->label != nullptr ? in->label : "";
  options.allow_host_spill = in->allow_host_spill != 0;
  if (in->connect_timeout_ms > 0) options.connect_timeout_ms = in->connect_timeout_ms;
  options.mode = in->mode == STASH_MODE_MAPPED ? stash::Mode::kMapped : stash::Mode::kDaemonCopy;
  options.lease.automatic = in->lease_automatic != 0;
  options.lease.device_bytes = in->lease_device_bytes;
  options.lease.peer_bytes = in->lease_peer_bytes;
  options.lease.host_bytes = in->lease_host_bytes;
  if (in->copy_threads > 0) options.copy_threads = in->copy_threads;
  auto client = stash::Client::Open(options);
  if (!client.ok()) return Fail(client.status());
  *out = new stash_client{std::move(client).value()};
  return 0;
}

}  // namespace

int stash_client_open_ex(const stash_open_options_t* in, stash_client_t** out) {
  return OpenWithOptions("stash_client_open_ex", in, stash::Options(), out);
}

int stash_client_open_group(const stash_open_options_t* in, const char* group,
                            const void* group_secret, uint64_t group_secret_bytes,
                            stash_client_t** out) {
  STASH_C_REQUIRE(group_secret != nullptr || group_secret_bytes == 0,
                  "stash_client_open_group: group_secret is NULL but group_secret_bytes is " +
                      std::to_string(group_secret_bytes));
  STASH_C_REQUIRE(group_secret_bytes <= 1024, "stash_client_open_group: group_secret_bytes is " +
                                                  std::to_string(group_secret_bytes) +
                                                  ": a group's secret is 32 bytes");
  stash::Options options;
  options.group = group != nullptr ? group : "";
  if (group_secret_bytes > 0) {
    options.group_secret.assign(static_cast<const char*>(group_secret),
                                static_cast<size_t>(group_secret_bytes));
  }
  return OpenWithOptions("stash_client_open_group", in, std::move(options), out);
}

void stash_client_close(stash_client_t* client) { delete client; }

int stash_buffer_alloc(uint64_t bytes, stash_buffer_t** out) {
  STASH_C_REQUIRE(out != nullptr, "stash_buffer_alloc: out is NULL");
  auto buffer = stash::HostBuffer::Allocate(bytes);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new stash_buffer{std::move(buffer).value()};
  return 0;
}

void stash_buffer_free(stash_buffer_t* buffer) { delete buffer; }
void* stash_buffer_data(const stash_buffer_t* buffer) { return buffer->buffer->data(); }
uint64_t stash_buffer_size(const stash_buffer_t* buffer) { return buffer->buffer->size(); }

void stash_event_signal(stash_buffer_t* buffer, uint64_t offset, uint64_t value) {
  stash::SignalEvent({buffer->buffer.get(), offset, value});
}

int stash_event_wait(stash_buffer_t* buffer, uint64_t offset, uint64_t value, int64_t timeout_ms) {
  return stash::WaitEvent({buffer->buffer.get(), offset, value}, timeout_ms) ? 1 : 0;
}

int stash_stash(stash_client_t* client, const stash_stash_args_t* args, uint64_t* ticket) {
  STASH_C_REQUIRE(client != nullptr && args != nullptr && ticket != nullptr,
                  "stash_stash: client, args and ticket must not be NULL");
  STASH_C_REQUIRE(args->source != nullptr || args->device_source != nullptr,
                  "stash_stash: set args->source (a buffer) or args->device_source");
  return Stash(client, StashArgsOf(args), ticket);
}

int stash_stash_wait(stash_client_t* client, const stash_stash_args_t* args, int64_t timeout_ms,
                     uint64_t* ticket, stash_completion_t* out) {
  STASH_C_REQUIRE(client != nullptr && args != nullptr,
                  "stash_stash_wait: client and args must not be NULL");
  STASH_C_REQUIRE(args->source != nullptr || args->device_source != nullptr,
                  "stash_stash_wait: set args->source (a buffer) or args->device_source");
  return Answer(client->client->StashAndWait(StashArgsOf(args), timeout_ms, ticket), out);
}

int stash_stash_on_stream(stash_client_t* client, const stash_stash_args_t* args, int keep_source,
                          void* stream, uint64_t* ticket) {
  STASH_C_REQUIRE(client != nullptr && args != nullptr && ticket != nullptr,
                  "stash_stash_on_stream: client, args and ticket must not be NULL");
  STASH_C_REQUIRE(args->device_source != nullptr,
                  "stash_stash_on_stream: set args->device_source (a device pointer)");
  STASH_C_REQUIRE_ON_STREAM(client, "stash_stash_on_stream");
  stash::StashArgs a = StashArgsOf(args);
  a.keep_source = keep_source != 0;
  a.stream = stream;
  return Stash(client, a, ticket);
}

int stash_reload_on_stream(stash_client_t* client, uint64_t ticket, void* destination,
                           int zero_tail, void* stream, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && destination != nullptr && op != nullptr,
                  "stash_reload_on_stream: client, destination and op must not be NULL");
  STASH_C_REQUIRE_ON_STREAM(client, "stash_reload_on_stream");
  stash::ReloadArgs a;
  a.ticket = ticket;
  a.device_destination = destination;
  a.zero_tail = zero_tail != 0;
  a.stream = stream;
  return Answer(client->client->Reload(a), op);
}

int stash_release_on_stream(stash_client_t* client, uint64_t ticket, void* stream, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && op != nullptr, "stash_release_on_stream: NULL argument");
  STASH_C_REQUIRE_ON_STREAM(client, "stash_release_on_stream");
  return Answer(client->client->Release(ticket, stream), op);
}

int stash_begin_step_on_stream(stash_client_t* client, uint64_t step, void* stream, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && op != nullptr, "stash_begin_step_on_stream: NULL argument");
  STASH_C_REQUIRE_ON_STREAM(client, "stash_begin_step_on_stream");
  return Answer(client->client->BeginStep(step, stream), op);
}

int stash_graphs_destroyed(stash_client_t* client) {
  STASH_C_REQUIRE(client != nullptr, "stash_graphs_destroyed: client is NULL");
  const stash::Status st = client->client->GraphsDestroyed();
  return st.ok() ? 0 : Fail(st);
}

int stash_reload(stash_client_t* client, uint64_t ticket, stash_buffer_t* destination,
                 uint64_t offset, int zero_tail, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && destination != nullptr && op != nullptr,
                  "stash_reload: client, destination and op must not be NULL");
  return Answer(client->client->Reload(HostReloadArgs(ticket, destination, offset, zero_tail)), op);
}

int stash_reload_wait(stash_client_t* client, uint64_t ticket, stash_buffer_t* destination,
                      uint64_t offset, int zero_tail, int64_t timeout_ms, uint64_t* op,
                      stash_completion_t* out) {
  STASH_C_REQUIRE(client != nullptr && destination != nullptr,
                  "stash_reload_wait: client and destination must not be NULL");
  return Answer(client->client->ReloadAndWait(
                    HostReloadArgs(ticket, destination, offset, zero_tail), timeout_ms, op),
                out);
}

int stash_reload_device(stash_client_t* client, uint64_t ticket, void* destination, int zero_tail,
                        stash_buffer_t* ready_buffer, uint64_t ready_offset, uint64_t ready_value,
                        stash_buffer_t* done_buffer, uint64_t done_offset, uint64_t done_value,
                        uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && destination != nullptr && op != nullptr,
                  "stash_reload_device: client, destination and op must not be NULL");
  stash::ReloadArgs a;
  a.ticket = ticket;
  a.device_destination = destination;
  a.zero_tail = zero_tail != 0;
  if (ready_buffer != nullptr) a.ready = {ready_buffer->buffer.get(), ready_offset, ready_value};
  if (done_buffer != nullptr) a.done = {done_buffer->buffer.get(), done_offset, done_value};
  return Answer(client->client->Reload(a), op);
}

int stash_enqueue_signal(stash_client_t* client, stash_buffer_t* buffer, uint64_t offset,
                         uint64_t value, void* stream) {
  STASH_C_REQUIRE(client != nullptr && buffer != nullptr,
                  "stash_enqueue_signal: client and buffer must not be NULL");
  const stash::Status st =
      client->client->EnqueueSignal({buffer->buffer.get(), offset, value}, stream);
  return st.ok() ? 0 : Fail(st);
}

int stash_enqueue_wait(stash_client_t* client, stash_buffer_t* buffer, uint64_t offset,
                       uint64_t value, void* stream) {
  STASH_C_REQUIRE(client != nullptr && buffer != nullptr,
                  "stash_enqueue_wait: client and buffer must not be NULL");
  const stash::Status st =
      client->client->EnqueueWait({buffer->buffer.get(), offset, value}, stream);
  return st.ok() ? 0 : Fail(st);
}

int stash_release_device_mappings(stash_client_t* client, int64_t timeout_ms) {
  STASH_C_REQUIRE(client != nullptr, "stash_release_device_mappings: client is NULL");
  const stash::Status st = client->client->ReleaseDeviceMappings(timeout_ms);
  return st.ok() ? 0 : Fail(st);
}

int stash_unregister_device(stash_client_t* client, const void* pointer, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && op != nullptr, "stash_unregister_device: NULL argument");
  return Answer(client->client->UnregisterDevice(pointer), op);
}

int stash_release(stash_client_t* client, uint64_t ticket, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && op != nullptr, "stash_release: NULL argument");
  return Answer(client->client->Release(ticket), op);
}

int stash_begin_step(stash_client_t* client, uint64_t step, uint64_t* op) {
  STASH_C_REQUIRE(client != nullptr && op != nullptr, "stash_begin_step: NULL argument");
  return Answer(client->client->BeginStep(step), op);
}

int stash_wait(stash_client_t* client, uint64_t op, int64_t timeout_ms, stash_completion_t* out) {
  STASH_C_REQUIRE(client != nullptr, "stash_wait: client is NULL");
  return Answer(client->client->Wait(op, timeout_ms), out);
}

int stash_poll(stash_client_t* client, uint64_t op, stash_completion_t* out) {
  STASH_C_REQUIRE(client != nullptr, "stash_poll: client is NULL");
  auto c = client->client->Poll(op);
  if (!c.has_value()) return -1;
  if (!c->ok()) return Fail(c->status());
  Fill(**c, out);
  return 0;
}

int stash_step_flags(stash_client_t* client, int* overflow, int* spilled) {
  STASH_C_REQUIRE(client != nullptr, "stash_step_flags: client is NULL");
  const stash::StepFlags flags = client->client->CurrentStepFlags();
  if (overflow != nullptr) *overflow = flags.overflow ? 1 : 0;
  if (spilled != nullptr) *spilled = flags.spilled ? 1 : 0;
  return 0;
}

int stash_step_lost(stash_client_t* client, int* lost) {
  STASH_C_REQUIRE(client != nullptr && lost != nullptr, "stash_step_lost: NULL argument");
  *lost = client->client->CurrentStepFlags().lost ? 1 : 0;
  return 0;
}

int stash_get_stats(stash_client_t* client, stash_stats_t* out) {
  STASH_C_REQUIRE(client != nullptr && out != nullptr, "stash_get_stats: NULL argument");
  auto s = client->client->Stats();
  if (!s.ok()) return Fail(s.status());
  std::memset(out, 0, sizeof(*out));
  out->page_bytes = s->page_bytes;
  out->pool_pages_total = s->pool_pages_total;
  out->pool_pages_used = s->pool_pages_used;
  out->pool_pages_high_water = s->pool_pages_high_water;
  out->host_pages_total = s->host_pages_total;
  out->host_pages_used = s->host_pages_used;
  out->host_pages_high_water = s->host_pages_high_water;
  out->stashes = s->stashes;
  out->reloads = s->reloads;
  out->releases = s->releases;
  out->bytes_stashed = s->bytes_stashed;
  out->bytes_reloaded = s->bytes_reloaded;
  out->spills = s->spills;
  out->overflows = s->overflows;
  out->rejected = s->rejected;
  out->stashes_live = s->stashes_live;
  out->pages_live = s->pages_live;
  return 0;
}

int stash_get_session(stash_client_t* client, stash_session_info_t* out) {
  STASH_C_REQUIRE(client != nullptr && out != nullptr, "stash_get_session: NULL argument");
  std::memset(out, 0, sizeof(*out));
  const std::string id = client->client->session_id();
  std::strncpy(out->session_id, id.c_str(), sizeof(out->session_id) - 1);
  out->page_bytes = client->client->page_bytes();
  out->pool_pages = client->client->pool_pages();
  out->host_tier_pages = client->client->host_tier_pages();
  return 0;
}

}  // extern "C"

"""Client: one session with the node's stash daemon (stash/client.h, through the C ABI)."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import sys
from typing import Optional, Tuple, Union

from stashd import _lib
from stashd.buffer import Buffer
from stashd.errors import UNAVAILABLE, error_for

# A count of valid tokens: a value known now, or (buffer, offset) of an int64 the daemon reads
# when the copy runs (the sync-free case).
Count = Union[int, Tuple[Buffer, int]]
# An event: (buffer, offset, value): the daemon waits until the counter at offset reaches value.
Event = Tuple[Buffer, int, int]

BACKENDS = {"host": 0, "cuda": 1}  # STASH_BACKEND_*
MODES = {"daemon-copy": 0, "mapped": 1}  # STASH_MODE_*
LEASE_TIERS = ("device", "peer", "host")


class Tier(enum.IntEnum):
    """Where a stash went (stash_completion_t.tier)."""

    NONE = 0      # not a stash or reload answer
    DEVICE = 1    # the rank's own pool
    HOST = 2      # the daemon's host tier (spilled)
    OVERFLOW = 3  # nothing was taken: the caller keeps its data
    PEER = 4      # another device's pool: spare chunks it lent (mapped, stashd --peer-tier), or
                  # a daemon-copy stash the own pool could not hold (stashd --copy-peer-tier)


@dataclasses.dataclass(frozen=True)
class Completion:
    """The daemon's answer to one operation."""

    ticket: int
    tier: Tier        # stash: where it went; reload: where it came from
    rows: int         # stash, reload: valid rows
    bytes: int        # stash, reload: payload bytes copied
    pages: int        # stash: pages held; release: pages returned
    latency_us: int   # stash, reload: receipt to copy done, in the daemon
    step_overflow: bool  # begin_step: the previous step's flags
    step_spilled: bool

    @property
    def overflowed(self) -> bool:
        """True when a stash took nothing: keep using the source."""
        return self.tier == Tier.OVERFLOW


@dataclasses.dataclass(frozen=True)
class StepFlags:
    overflow: bool  # a stash of this step overflowed (its source stayed with the caller)
    spilled: bool   # a stash of this step went outside its own pool (host tier or a peer's)
    # the session broke holding this step's stashes (daemon-copy: lost, rerun the step), or
    # stashd.torch could not reach the daemon in this step and kept tensors in-process
    unavailable: bool = False


@dataclasses.dataclass(frozen=True)
class Stats:
    """This session's counters and its pool's usage (pool fields cover every session)."""

    page_bytes: int
    pool_pages_total: int
    pool_pages_used: int
    pool_pages_high_water: int
    host_pages_total: int
    host_pages_used: int
    host_pages_high_water: int
    stashes: int
    reloads: int
    releases: int
    bytes_stashed: int
    bytes_reloaded: int
    spills: int
    overflows: int
    rejected: int
    stashes_live: int
    pages_live: int

    @property
    def pages_used(self) -> int:
        """Pages in use in the pool and the host tier together."""
        return self.pool_pages_used + self.host_pages_used


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """The live session (after a reconnect the new one; while a drained client holds none,
    the last one) and its pool's geometry."""

    session_id: str
    page_bytes: int
    pool_pages: int
    host_tier_pages: int


def version() -> str:
    """The loaded libstash_client.so's version, e.g. "0.1.0"."""
    return _lib.lib().stash_version().decode()


def _timeout(timeout_ms: Optional[float]) -> int:
    return -1 if timeout_ms is None else max(0, int(timeout_ms))


class Client:
    """One session with the daemon. Use connect() to make one.

    Every method may be called from any thread at once, except close(), which must not race
    with other calls. Methods that queue work (stash, reload, release, begin_step) wait for the
    daemon's answer by default and return a Completion; with wait=False they return the
    operation id (for a stash: its ticket) to pass to wait() or poll(). Each answer is handed
    out once. Errors raise StashError (Unavailable when the daemon is gone).
    """

    def __init__(self, handle: int, socket: Optional[str], backend: str = "host"):
        self._lib = _lib.lib()
        self._handle: Optional[int] = handle
        self.socket = socket
        self.backend = backend
        self._extensions: dict = {}  # per-client state of integrations (stashd.torch)
        self.mode = "daemon-copy"  # set by connect()
        self.device = 0  # set by connect()

    # --- Lifetime ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Ends the session: the daemon returns every page it holds for it. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.stash_client_close(handle)
        for ext in list(self._extensions.values()):
            closer = getattr(ext, "close", None)
            if closer is not None:
                closer()
        self._extensions.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"<stashd.Client socket={self.socket!r}{' closed' if self.closed else ''}>"

    def _h(self) -> int:
        if self._handle is None:
            raise error_for(UNAVAILABLE, "stashd: this client is closed")
        return self._handle

    def _check(self, code: int) -> None:
        if code != 0:
            raise error_for(code, _lib.last_error())

    def _answered(self, code: int, op: "ctypes.c_uint64", out: "_lib.CompletionStruct"
                  ) -> Completion:
        """The answer of a queue-and-wait call (stash_stash_wait, stash_reload_wait). A wait
        that failed after the queueing names the operation, still in flight after a timeout,
        in the error's op."""
        if code != 0:
            error = error_for(code, _lib.last_error())
            error.op = op.value or None
            raise error
        return _completion(out)

    @property
    def on_stream(self) -> bool:
        """True in mapped mode on the cuda backend: operations are enqueued on a CUDA stream
        (the library's kernels page the rows) and answered at once."""
        return self.mode == "mapped" and self.backend == "cuda"

    def _stream(self, stream: Optional[int]) -> Optional[int]:
        """The stream an operation is enqueued on: the one given, else (on_stream) PyTorch's
        current stream on the session's device; None for the other modes' calls."""
        if stream is not None:
            return int(stream)
        return current_stream(self.device) if self.on_stream else None

    # --- Data path --------------------------------------------------------------------------

    def stash(self, source: Buffer, *, row_bytes: int, max_rows: int, count: Count,
              offset: int = 0, divisor: int = 1, layer: int = 0, microbatch: int = 0,
              name: Optional[str] = None, ready: Optional[Event] = None, wait: bool = True,
              timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Stashes the valid row prefix of source[offset : offset + max_rows * row_bytes).

        count: valid tokens, an int or (buffer, offset) of an int64 read when the copy runs;
        rows = ceil(count / divisor) (1 for data, 32 for an MXFP8 columnwise scale_inv). ready: the
        daemon copies only after this event (default: now). The source must stay unchanged
        until the answer arrives; on OVERFLOW (completion.overflowed) nothing was taken.
        Returns the Completion (wait=True) or the ticket (wait=False).
        """
        args = _lib.StashArgs()
        args.source = source.handle
        args.offset = int(offset)
        args.row_bytes = int(row_bytes)
        args.max_rows = int(max_rows)
        if isinstance(count, tuple):
            count_buffer, count_offset = count
            args.count_buffer = count_buffer.handle
            args.count_offset = int(count_offset)
        else:
            count = int(count)
            if count < 0:
                raise ValueError(f"stashd: count must be >= 0, got {count}")
            args.count_value = count
        args.divisor = int(divisor)
        args.layer = int(layer)
        args.microbatch = int(microbatch)
        if ready is not None:
            ready_buffer, ready_offset, ready_value = ready
            args.ready_buffer = ready_buffer.handle
            args.ready_offset = int(ready_offset)
            args.ready_value = int(ready_value)
        if name:
            args.name = name.encode()
        ticket = ctypes.c_uint64()
        if wait:
            out = _lib.CompletionStruct()
            return self._answered(
                self._lib.stash_stash_wait(self._h(), ctypes.byref(args), _timeout(timeout_ms),
                                           ctypes.byref(ticket), ctypes.byref(out)),
                ticket, out)
        self._check(self._lib.stash_stash(self._h(), ctypes.byref(args), ctypes.byref(ticket)))
        return ticket.value

    def reload(self, ticket: int, destination: Buffer, *, offset: int = 0,
               zero_tail: bool = False, wait: bool = True,
               timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Copies a stash back into destination[offset:] (room for max_rows rows) and returns
        its pages. zero_tail: also write zeros to rows [rows, max_rows). The ticket is spent.
        NOT_FOUND (from the answer) for a ticket that is not a live stash of this session."""
        op = ctypes.c_uint64()
        if wait:
            out = _lib.CompletionStruct()
            return self._answered(
                self._lib.stash_reload_wait(self._h(), int(ticket), destination.handle,
                                            int(offset), 1 if zero_tail else 0,
                                            _timeout(timeout_ms), ctypes.byref(op),
                                            ctypes.byref(out)),
                op, out)
        self._check(self._lib.stash_reload(self._h(), int(ticket), destination.handle,
                                           int(offset), 1 if zero_tail else 0, ctypes.byref(op)))
        return op.value

    # --- Device memory (cuda backend) -------------------------------------------------------

    def stash_device(self, pointer: int, *, row_bytes: int, max_rows: int,
                     count: Optional[int] = None, device_count: Optional[int] = None,
                     divisor: int = 1, layer: int = 0, microbatch: int = 0,
                     name: Optional[str] = None, ready: Optional[Event] = None,
                     stream: Optional[int] = None, keep_source: bool = True,
                     wait: bool = True,
                     timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Stashes rows from GPU memory: pointer (a tensor's data_ptr()) lies in a cudaMalloc
        allocation of the session's GPU. Exactly one of count (an int known now) and
        device_count (the data_ptr() of an int64 on the GPU, read by the copy kernel: no sync)
        is given.

        Daemon-copy mode: ready is an event the trainer's stream raises (enqueue_signal) after
        the kernels that wrote the rows; the rows must stay unchanged until the answer arrives.

        Mapped mode (on_stream): the stash is enqueued on stream (a cudaStream_t as an int;
        default: PyTorch's current stream) after the kernels that wrote the rows; no event, and
        the answer comes at once (tier NONE: only the GPU knows where the rows went).
        keep_source=True: an overflowed stash is reloaded from pointer, which must stay
        unchanged until the reload or release; False: the memory may be reused once the stream
        passes the stash, and an overflowed stash's reload leaves its destination as it was and
        sets the step's overflow flag (step_flags() after synchronizing the stream): rerun the
        step (stashd.torch.overflow_guard does)."""
        if (count is None) == (device_count is None):
            raise ValueError("stashd: give exactly one of count and device_count")
        args = _lib.StashArgs()
        args.device_source = int(pointer)
        args.row_bytes = int(row_bytes)
        args.max_rows = int(max_rows)
        if device_count is not None:
            args.device_count = int(device_count)
        else:
            if int(count) < 0:
                raise ValueError(f"stashd: count must be >= 0, got {count}")
            args.count_value = int(count)
        args.divisor = int(divisor)
        args.layer = int(layer)
        args.microbatch = int(microbatch)
        if ready is not None:
            args.ready_buffer = ready[0].handle
            args.ready_offset = int(ready[1])
            args.ready_value = int(ready[2])
        if name:
            args.name = name.encode()
        ticket = ctypes.c_uint64()
        on = self._stream(stream)
        if not keep_source and on is None:
            raise ValueError("stashd: keep_source=False is for mapped mode on the cuda backend "
                             "(client.on_stream), where the stash runs on a stream; drop it")
        if on is None and wait:
            out = _lib.CompletionStruct()
            return self._answered(
                self._lib.stash_stash_wait(self._h(), ctypes.byref(args), _timeout(timeout_ms),
                                           ctypes.byref(ticket), ctypes.byref(out)),
                ticket, out)
        if on is None:
            self._check(self._lib.stash_stash(self._h(), ctypes.byref(args),
                                              ctypes.byref(ticket)))
        else:
            self._check(self._lib.stash_stash_on_stream(self._h(), ctypes.byref(args),
                                                        1 if keep_source else 0, on or None,
                                                        ctypes.byref(ticket)))
        return self.wait(ticket.value, timeout_ms) if wait else ticket.value

    def reload_device(self, ticket: int, pointer: int, *, zero_tail: bool = False,
                      ready: Optional[Event] = None, done: Optional[Event] = None,
                      stream: Optional[int] = None, wait: bool = True,
                      timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Copies a stash back into GPU memory at pointer (room for max_rows rows).
        Daemon-copy mode: ready: the daemon writes only after this event; done: raised after
        the copy, for enqueue_wait. Mapped mode (on_stream): enqueued on stream (default:
        PyTorch's current stream) before the kernels that read pointer; no events."""
        on = self._stream(stream)
        op = ctypes.c_uint64()
        if on is not None:
            if ready is not None or done is not None:
                raise ValueError("stashd: reload_device on a stream takes no ready or done "
                                 "event: the stream orders the copy; drop them")
            self._check(self._lib.stash_reload_on_stream(self._h(), int(ticket), int(pointer),
                                                         1 if zero_tail else 0, on or None,
                                                         ctypes.byref(op)))
            return self.wait(op.value, timeout_ms) if wait else op.value

        def parts(e: Optional[Event]):
            return (None, 0, 0) if e is None else (e[0].handle, int(e[1]), int(e[2]))
        self._check(self._lib.stash_reload_device(self._h(), int(ticket), int(pointer),
                                                  1 if zero_tail else 0, *parts(ready),
                                                  *parts(done), ctypes.byref(op)))
        return self.wait(op.value, timeout_ms) if wait else op.value

    def enqueue_signal(self, event: Event, stream: int) -> None:
        """Enqueues on stream (torch.cuda.current_stream().cuda_stream; 0 = the legacy default
        stream) raising event once the stream's earlier work is done. Never blocks."""
        buffer, offset, value = event
        self._check(self._lib.stash_enqueue_signal(self._h(), buffer.handle, int(offset),
                                                   int(value), int(stream) or None))

    def enqueue_wait(self, event: Event, stream: int) -> None:
        """Makes stream's later work wait until event is raised (a reload's done). Never
        blocks the calling thread."""
        buffer, offset, value = event
        self._check(self._lib.stash_enqueue_wait(self._h(), buffer.handle, int(offset),
                                                 int(value), int(stream) or None))

    def unregister_device(self, pointer: int, *, wait: bool = True) -> Union[Completion, int]:
        """Tells the daemon to close the allocation holding pointer before it is freed."""
        op = ctypes.c_uint64()
        self._check(self._lib.stash_unregister_device(self._h(), int(pointer), ctypes.byref(op)))
        return self.wait(op.value) if wait else op.value

    def release_device_mappings(self, timeout_ms: Optional[float] = None) -> None:
        """Closes the daemon's mappings of every GPU allocation this session used and waits for
        that; the next stash from one registers it again. Call it before giving cached memory
        back (torch.cuda.empty_cache()), which cannot free memory the daemon has open. Nothing
        to do on the host backend."""
        self._check(self._lib.stash_release_device_mappings(self._h(), _timeout(timeout_ms)))

    def graphs_destroyed(self) -> None:
        """Mapped mode on the cuda backend: every CUDA graph that captured this client's stashes,
        reloads or releases is gone (torch.cuda.CUDAGraph.reset(), or the graph deleted), so
        the plan slots kept for their replays come back. A job that captures again and again
        calls it after dropping the old graphs; never while one may still replay. Raises
        (FAILED_PRECONDITION) in the other modes."""
        self._check(self._lib.stash_graphs_destroyed(self._h()))

    def release(self, ticket: int, *, stream: Optional[int] = None, wait: bool = True,
                timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Drops a stash without copying it back; its pages return. Mapped mode on the cuda
        backend: enqueued on stream (default: PyTorch's current stream)."""
        on = self._stream(stream)
        op = ctypes.c_uint64()
        if on is None:
            self._check(self._lib.stash_release(self._h(), int(ticket), ctypes.byref(op)))
        else:
            self._check(self._lib.stash_release_on_stream(self._h(), int(ticket), on or None,
                                                          ctypes.byref(op)))
        return self.wait(op.value, timeout_ms) if wait else op.value

    def begin_step(self, step: int, *, stream: Optional[int] = None, wait: bool = True,
                   timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        """Starts a training step: clears the step flags (stashd.torch's too). The Completion
        carries the previous step's flags (step_overflow, step_spilled), except in mapped mode
        on the cuda backend, where the step boundary is enqueued on stream (default: PyTorch's
        current stream) and the lease grows or shrinks here, outside graph capture."""
        for ext in list(self._extensions.values()):
            hook = getattr(ext, "begin_step", None)
            if hook is not None:
                hook(int(step))
        on = self._stream(stream)
        op = ctypes.c_uint64()
        if on is None:
            self._check(self._lib.stash_begin_step(self._h(), int(step), ctypes.byref(op)))
        else:
            self._check(self._lib.stash_begin_step_on_stream(self._h(), int(step), on or None,
                                                             ctypes.byref(op)))
        return self.wait(op.value, timeout_ms) if wait else op.value

    def wait(self, op: int, timeout_ms: Optional[float] = None) -> Completion:
        """Blocks until op is answered (DeadlineExceeded after timeout_ms; None = forever)."""
        out = _lib.CompletionStruct()
        self._check(self._lib.stash_wait(self._h(), int(op), _timeout(timeout_ms),
                                         ctypes.byref(out)))
        return _completion(out)

    def poll(self, op: int) -> Optional[Completion]:
        """The answer to op if it has arrived, else None; never blocks."""
        out = _lib.CompletionStruct()
        code = self._lib.stash_poll(self._h(), int(op), ctypes.byref(out))
        if code == -1:
            return None
        self._check(code)
        return _completion(out)

    # --- State ------------------------------------------------------------------------------

    def step_flags(self) -> StepFlags:
        """The current step's flags, as far as answers have arrived (mapped mode on the cuda
        backend: as far as the GPU got; synchronize the stream first). `unavailable`: the
        session broke holding stashes of this step (daemon-copy: their reloads fail; rerun the
        step), or stashd.torch found no daemon for a stash and kept its tensor."""
        unavailable = any(getattr(ext, "step_unavailable", False)
                          for ext in self._extensions.values())
        overflow, spilled, lost = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.stash_step_flags(self._h(), ctypes.byref(overflow),
                                               ctypes.byref(spilled)))
        self._check(self._lib.stash_step_lost(self._h(), ctypes.byref(lost)))
        return StepFlags(bool(overflow.value), bool(spilled.value),
                         unavailable or bool(lost.value))

    def session(self) -> SessionInfo:
        """The live session's id and geometry (no round trip). It changes when the client
        reconnects at a begin_step after the daemon died, restarted or drained."""
        out = _lib.SessionInfoStruct()
        self._check(self._lib.stash_get_session(self._h(), ctypes.byref(out)))
        return SessionInfo(out.session_id.decode(), int(out.page_bytes), int(out.pool_pages),
                           int(out.host_tier_pages))

    @property
    def session_id(self) -> str:
        """The live session's id (see session())."""
        return self.session().session_id

    def stats(self) -> Stats:
        """This session's counters and its pool's usage (one round trip to the daemon). After
        a reconnect: the new session's. Raises Unavailable while the session is gone (the
        daemon died: the next begin_step reconnects) or none is open (drained)."""
        out = _lib.StatsStruct()
        self._check(self._lib.stash_get_stats(self._h(), ctypes.byref(out)))
        return Stats(**{name: int(getattr(out, name)) for name in _lib.STATS_FIELDS})


def _completion(c: "_lib.CompletionStruct") -> Completion:
    try:
        tier = Tier(c.tier)
    except ValueError:
        tier = Tier.NONE
    return Completion(ticket=int(c.ticket), tier=tier, rows=int(c.rows), bytes=int(c.bytes),
                      pages=int(c.pages), latency_us=int(c.latency_us),
                      step_overflow=bool(c.step_overflow), step_spilled=bool(c.step_spilled))


def current_stream(device: int) -> int:
    """PyTorch's current stream on device as a cudaStream_t int, when PyTorch has initialised
    CUDA; else 0 (the legacy default stream)."""
    torch = sys.modules.get("torch")  # never imported here: `import stashd` needs no torch
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_stream(device).cuda_stream)
        except Exception:  # a CPU-only build or a broken driver
            pass
    return 0

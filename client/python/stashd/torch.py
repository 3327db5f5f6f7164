"""PyTorch integration: marked saved activations go to the daemon in forward, come back in backward.

    import stashd
    import stashd.torch as stash_torch

    client = stashd.connect()
    with stash_torch.stash_saved_tensors(client, max_tokens, tokens_per_expert.sum()):
        out = experts(permuted_hidden)           # GroupedLinear etc. mark what they save
    out.backward(grad)                           # stashed activations come back here

`stash_saved_tensors` installs `torch.autograd.graph.saved_tensors_hooks` for the duration of
one layer. The pack hook takes a saved tensor only when it is *marked*; everything else, 0-dim
and empty tensors included, passes through untouched, exactly as Megatron's paged stash does.
A tensor is marked when:

  * it carries Transformer Engine's attribute `grouped_tensor_scale_inv` (set by TE's
    `mark_grouped_tensor`): False = token-major data, `max_tokens` rows; True = an MXFP8
    columnwise scale_inv, `max_tokens / 32` rows (one per 32 tokens);
  * or `mark(t)` gave it stashd's own attribute (same meaning, immune to a TE rename);
  * or `register(t)` recorded its storage (storage pointer, byte offset, byte size) with the
    active context. Python attributes live on one tensor object and `view`, `reshape`,
    `detach` (and activation recompute's `detach_variable`) drop them; storage registration
    still matches the contiguous aliases they produce. Registrations hold the tensor weakly
    and end with the context.

A marked tensor is split into rows (row width = bytes / rows, which must divide exactly) and
only the prefix of valid rows, `num_tokens // divisor`, is stashed. In this host-backend path
the pack hook copies the tensor into a pooled shared-memory staging Buffer, asks the daemon to
stash it and waits for the confirmation ("a client keeps its activation until the daemon
confirms the copy"); the staging Buffer then returns to the pool and the hook hands autograd a
small StashedTensor instead of the tensor, so the activation's memory is freed. When the daemon
answers OVERFLOW (pool and host tier full, or a count beyond max_tokens), nothing was taken:
the hook returns the tensor itself and the session's step flag `overflow` is set
(`client.step_flags()`), so results stay exact and a trainer may choose to rerun the step.

The unpack hook reloads the rows into a staging Buffer and from there into a fresh tensor of
the saved tensor's shape, dtype and device; the daemon returns the pages. Rows past the valid
prefix are zeros with zero_tail=True and uninitialised otherwise (Megatron's default).
A tensor that two ops save is stashed twice (once per save), as in Megatron. A handle autograd
drops unread (a graph freed before backward) releases its stash; `flush(client)` waits for those
releases. Unpacking a handle twice (retain_graph=True) reloads once and reuses the tensor.

With a client on the cuda backend (`stashd.connect(backend="cuda")`), CUDA tensors take the
sync-free path instead: no staging, no `.item()`, no host copy of the count, and the trainer's
thread never waits for a copy.
  * pack: the hook raises a ready event on the tensor's current stream (a stream memory
    operation, `Client.enqueue_signal`) and queues the stash of `t.data_ptr()` through CUDA IPC
    with the count as a device int64 (`num_tokens` converted on the GPU when it is a tensor),
    then returns at once. The handle keeps the tensor until the daemon's answer arrives (it is
    polled at every later hook call): taken, the tensor is dropped and its memory goes back to
    the caching allocator; OVERFLOW, the handle keeps it and backward uses it.
  * unpack: a fresh tensor from the caching allocator, a ready event on the current stream so
    the daemon writes only after the stream's earlier work, the reload, and a wait on its done
    event enqueued on the stream: the kernels after it read the reloaded rows.
  * A failed reload raises its done event too (the stream never hangs) and its error is
    raised by the next hook call or by `flush(client)`: call flush before optimizer.step().
  * Tensors must come from cudaMalloc memory (PyTorch's default caching allocator);
    `expandable_segments` memory is refused with the setting to change.
The host backend keeps the staging path above (CPU tensors, and CUDA tensors staged through
host memory: a device sync per saved tensor).
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import weakref
from typing import Deque, Dict, List, Optional, Sequence, Tuple, Union

# This module is `stashd.torch`; with absolute imports (Python 3) `import torch` is PyTorch.
import torch

from stashd.buffer import Buffer
from stashd.client import Client, Tier
from stashd.errors import UNAVAILABLE, StashError, error_for

TE_MARKER_ATTRIBUTE = "grouped_tensor_scale_inv"
STASHD_MARKER_ATTRIBUTE = "stashd_scale_inv"
# MXFP8 keeps one E8M0 scale per 32 values: a columnwise scale_inv has a row per 32 tokens.
SCALE_INV_BLOCK_TOKENS = 32

# Staging buffers are rounded up so that tensors of nearby sizes share one: 8 size classes per
# power of two, at least one 64 KiB granule.
_MIN_STAGING_BYTES = 64 << 10
_COUNT_CELL_BYTES = 8
# Event counters of the cuda path: one per (stream, ready|done).
_EVENT_SLOTS = 512


# --- Marking --------------------------------------------------------------------------------

def mark(*tensors: Optional[torch.Tensor], scale_inv: bool = False):
    """Marks tensors for the stash with stashd's own attribute; None entries are skipped.

    scale_inv=False: token-major data (max_tokens rows); True: an MXFP8 columnwise scale_inv
    (max_tokens / 32 rows). Returns the tensor (one argument) or the tuple. Like TE's marker the
    attribute is lost by view/reshape/detach: use register() for tensors that pass through those.
    """
    for t in tensors:
        if t is not None:
            setattr(t, STASHD_MARKER_ATTRIBUTE, bool(scale_inv))
    return tensors[0] if len(tensors) == 1 else tensors


def marker(t: torch.Tensor) -> Optional[bool]:
    """The marker a tensor carries: None = unmarked, False = data rows, True = scale_inv rows.
    TE's attribute is read first, stashd's own second (registration is per context)."""
    for name in (TE_MARKER_ATTRIBUTE, STASHD_MARKER_ATTRIBUTE):
        value = getattr(t, name, None)
        if value is not None:
            return bool(value)
    return None


def _storage_ptr(t: torch.Tensor) -> int:
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return storage.data_ptr()


def _storage_key(t: torch.Tensor) -> Tuple[int, int, int]:
    """(storage pointer, byte offset, bytes): identical for t and its contiguous aliases."""
    base = _storage_ptr(t)
    return (base, t.data_ptr() - base, t.numel() * t.element_size())


def register(*tensors: Optional[torch.Tensor], scale_inv: bool = False):
    """Registers tensors by storage with this thread's innermost active stash_saved_tensors.

    A saved tensor matches when it is contiguous and covers the same bytes of the same storage:
    views, reshapes, dtype views and detached aliases of a registered tensor all do, and the
    attribute they lost does not matter. Registrations hold tensors weakly (a freed tensor's
    entry is ignored, so reused memory never matches) and end when the context exits. None
    entries are skipped. Outside a context it does nothing (the stash is off there), so layer
    code may call it unconditionally, as it calls TE's mark_grouped_tensor. Returns the tensor
    (one argument) or the tuple.
    """
    ctx = _active()
    if ctx is None:
        return tensors[0] if len(tensors) == 1 else tensors
    for t in tensors:
        if t is not None:
            ctx.register(t, scale_inv=scale_inv)
    return tensors[0] if len(tensors) == 1 else tensors


def as_tensor(buffer: Buffer, dtype: torch.dtype, shape: Sequence[int],
              offset: int = 0) -> torch.Tensor:
    """A tensor over buffer[offset:] (no copy). It keeps the Buffer object alive, but
    buffer.free() unmaps the memory at once: drop the tensor first."""
    shape = tuple(int(s) for s in shape)
    count = math.prod(shape)
    element = torch.empty((), dtype=dtype).element_size()
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    array = buffer._array(offset, count * element)
    return torch.frombuffer(array, dtype=dtype, count=count).view(shape)


# --- Per-client state: staging buffers and dropped stashes ----------------------------------

class _Staging:
    """A pooled Buffer with a byte tensor over it."""

    __slots__ = ("buffer", "bytes")

    def __init__(self, size: int):
        self.buffer = Buffer(size)
        self.bytes = as_tensor(self.buffer, torch.uint8, (self.buffer.size,))


def _size_class(nbytes: int) -> int:
    if nbytes <= _MIN_STAGING_BYTES:
        return _MIN_STAGING_BYTES
    step = max(_MIN_STAGING_BYTES, (1 << (nbytes.bit_length() - 1)) // 8)
    return -(-nbytes // step) * step


class _TorchState:
    """What stashd.torch keeps per Client: a pool of staging Buffers by size class, and the
    release operations of stashes autograd dropped without unpacking them.

    Staging Buffers are never freed before the session ends: the daemon maps each Buffer once
    and keeps the mapping for the whole session, so freeing one here would save nothing. Pack
    and unpack each hold one Buffer only until the daemon answers, so the pool holds about one
    Buffer per size class in use.
    """

    def __init__(self, client: Client):
        # Weak: the client owns this state (client._extensions), and a cycle would keep a
        # forgotten client's session open until the garbage collector runs.
        self._client = weakref.ref(client)
        self._lock = threading.Lock()
        self._free: Dict[int, List[_Staging]] = {}
        self._all: List[_Staging] = []
        # Op ids of releases not yet answered; a deque so that __del__ on any thread may append
        # while another thread reaps.
        self._releases: Deque[int] = collections.deque()
        # The cuda path: stashes whose answer has not arrived, reloads not yet answered, the
        # first reload error not yet raised, and the event counters, one per (stream, kind),
        # in one Buffer. `_order` keeps each counter's values in submission order.
        self._pending: Deque["StashedTensor"] = collections.deque()
        self._reloads: Deque[Tuple[int, "StashedTensor"]] = collections.deque()
        self._reload_error: Optional[StashError] = None
        self._order = threading.Lock()
        self._events: Optional[_Staging] = None
        self._slots: Dict[Tuple[int, str], int] = {}
        self._values: Dict[int, int] = {}

    @property
    def client(self) -> Client:
        client = self._client()
        if client is None:
            raise error_for(UNAVAILABLE, "stashd.torch: the client of this stash was garbage "
                            "collected, which ended its session")
        return client

    def _live_client(self) -> Optional[Client]:
        client = self._client()
        return None if client is None or client.closed else client

    @staticmethod
    def of(client: Client) -> "_TorchState":
        state = client._extensions.get("torch")
        if state is None:
            state = client._extensions.setdefault("torch", _TorchState(client))
        return state

    def take(self, nbytes: int) -> _Staging:
        size = _size_class(max(int(nbytes), 1))
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        staging = _Staging(size)
        with self._lock:
            self._all.append(staging)
        return staging

    def give(self, staging: _Staging) -> None:
        with self._lock:
            self._free.setdefault(staging.buffer.size, []).append(staging)

    def release_later(self, ticket: int) -> None:
        """Queues a release without blocking (safe from __del__ on any thread)."""
        client = self._live_client()
        if client is None:
            return  # the session is over: the daemon returned the pages already
        self._releases.append(client.release(ticket, wait=False))

    def event(self, stream: int, kind: str) -> Tuple[Buffer, int, int]:
        """The next value of the (stream, kind) counter; hold `_order` until it is used."""
        if self._events is None:
            self._events = self.take(_EVENT_SLOTS * _COUNT_CELL_BYTES)
            self._events.bytes.zero_()
        slot = self._slots.get((stream, kind))
        if slot is None:
            if len(self._slots) == _EVENT_SLOTS:
                raise RuntimeError(f"stashd.torch: more than {_EVENT_SLOTS // 2} CUDA streams "
                                   "stash or reload through one client")
            slot = self._slots[(stream, kind)] = len(self._slots)
        value = self._values[slot] = self._values.get(slot, 0) + 1
        return (self._events.buffer, slot * _COUNT_CELL_BYTES, value)

    def track_stash(self, handle: "StashedTensor") -> None:
        self._pending.append(handle)

    def track_reload(self, op: int, handle: "StashedTensor") -> None:
        self._reloads.append((op, handle))

    def _settle(self, client: Client, wait: bool) -> None:
        """Collects the answers of the cuda path's stashes and reloads."""
        for _ in range(len(self._pending)):
            try:
                handle = self._pending.popleft()
            except IndexError:
                break
            if not handle._settle(client, wait):
                self._pending.append(handle)
        for _ in range(len(self._reloads)):
            try:
                op, handle = self._reloads.popleft()
            except IndexError:
                break
            try:
                if wait:
                    client.wait(op)
                elif client.poll(op) is None:
                    self._reloads.append((op, handle))
            except StashError as e:
                if self._reload_error is None:
                    self._reload_error = error_for(
                        e.code, f"stashd.torch: the reload of {handle!r} failed, so the "
                        f"backward pass read wrong data: {e}")
        error, self._reload_error = self._reload_error, None
        if error is not None:
            raise error

    def reap(self, wait: bool = False) -> None:
        """Collects answered releases (all of them with wait=True), and the cuda path's
        answers: raises the first failed reload."""
        client = self._live_client()
        if client is None:
            self._releases.clear()
            self._pending.clear()
            self._reloads.clear()
            return
        self._settle(client, wait)
        for _ in range(len(self._releases)):
            try:
                op = self._releases.popleft()
            except IndexError:  # another thread reaped it
                break
            try:
                if wait:
                    client.wait(op)
                elif client.poll(op) is None:
                    self._releases.append(op)
            except StashError:
                # A refused release holds no pages (the daemon did not know the ticket, or the
                # session is gone): nothing to give back, and no caller to tell.
                pass

    def close(self) -> None:
        """Frees every staging Buffer (the client calls this after its session ended)."""
        with self._lock:
            staging, self._all, self._free = self._all, [], {}
        for s in staging:
            s.bytes = None
            s.buffer.free()
        self._releases.clear()


def flush(client: Client) -> None:
    """Waits until the daemon has answered the release of every stash autograd dropped without
    unpacking it (a graph freed before backward): their pages are free when this returns. On the
    cuda path it also waits for every stash and reload answer and raises the first failed
    reload: call it before optimizer.step()."""
    state = client._extensions.get("torch")
    if state is not None:
        state.reap(wait=True)


def empty_cache(client: Client) -> None:
    """torch.cuda.empty_cache() that works with stashd: waits for every pending answer
    (flush), has the daemon close its mappings of this process's GPU allocations, then empties
    PyTorch's cache. Without the middle step, segments the daemon has open stay allocated."""
    flush(client)
    client.release_device_mappings()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- The handle autograd keeps instead of a stashed tensor ----------------------------------

class StashedTensor:
    """What the pack hook returns for a stashed tensor: the ticket and what unpack needs to
    rebuild the tensor. Unpacking twice (retain_graph=True) reloads once and hands back the same
    tensor; a handle autograd drops without unpacking releases its pages."""

    __slots__ = ("_state", "_client", "ticket", "shape", "dtype", "device", "rows", "max_rows",
                 "row_bytes", "divisor", "tier", "zero_tail", "_tensor", "_spent", "_source",
                 "_count", "_ctx", "_cuda", "_lock", "__weakref__")

    def __init__(self, state: _TorchState, ticket: int, tensor: torch.Tensor, rows: int,
                 max_rows: int, row_bytes: int, divisor: int, tier, zero_tail: bool):
        self._state = state
        self._client = state.client  # the session that holds the pages must outlive the handle
        self.ticket = ticket
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.rows = rows
        self.max_rows = max_rows
        self.row_bytes = row_bytes
        self.divisor = divisor
        self.tier = tier
        self.zero_tail = zero_tail
        self._tensor: Optional[torch.Tensor] = None
        self._spent = False
        # The cuda path: the source (and device count) kept until the daemon answers, and the
        # context whose counters the answer corrects.
        self._source: Optional[torch.Tensor] = None
        self._count: Optional[torch.Tensor] = None
        self._ctx = None
        self._cuda = False  # stashed by the cuda path
        self._lock = threading.Lock()  # the cuda path: one thread collects the answer

    def __repr__(self) -> str:
        tier = "pending" if self.tier is None else self.tier.name
        return (f"<stashd.torch.StashedTensor ticket=0x{self.ticket:x} shape={tuple(self.shape)} "
                f"dtype={self.dtype} rows={self.rows}/{self.max_rows} tier={tier}>")

    def _settle(self, client: Client, wait: bool) -> bool:
        """The cuda path: takes the stash's answer if it arrived (blocks with wait=True).
        Returns False while it is in flight."""
        if self.tier is not None:
            return True
        with self._lock:  # a hook on another thread may be collecting it right now
            if self.tier is not None:
                return True
            return self._settle_locked(client, wait)

    def _settle_locked(self, client: Client, wait: bool) -> bool:
        try:
            done = client.wait(self.ticket) if wait else client.poll(self.ticket)
        except StashError:
            done = None
            failed = True
        else:
            if done is None:
                return False
            failed = False
        self._count = None
        ctx = self._ctx() if self._ctx is not None else None
        self._ctx = None
        if failed or done.overflowed:
            # Nothing was taken: keep the tensor itself for backward; no pages to give back.
            self.tier = Tier.OVERFLOW
            self._spent = True
            if ctx is not None:
                ctx.stashed -= 1
                ctx.overflowed += 1
            return True
        self.tier = done.tier
        self.rows = done.rows
        self._source = None  # the daemon holds the rows: the memory goes back to the allocator
        return True

    def _load_device(self) -> torch.Tensor:
        """The cuda path: reload into a fresh tensor, ordered on the current stream."""
        state = self._state
        if self.tier is None:
            self._settle(self._client, wait=True)  # rare: backward ran before the answer came
        if self.tier == Tier.OVERFLOW:
            return self._source
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._spent = True  # the ticket is spent even when the reload fails
        with state._order:
            ready = state.event(stream, "ready")
            self._client.enqueue_signal(ready, stream)
            done = state.event(stream, "done")
            op = self._client.reload_device(self.ticket, out.data_ptr(),
                                            zero_tail=self.zero_tail, ready=ready, done=done,
                                            wait=False)
            self._client.enqueue_wait(done, stream)
        state.track_reload(op, self)
        return out

    def load(self) -> torch.Tensor:
        """Reloads the rows (once) into a fresh tensor of the original shape, dtype, device."""
        if self._tensor is not None:
            return self._tensor
        if self._cuda:
            out = self._load_device()
            self._tensor = out
            self._state.reap()
            return out
        state = self._state
        nbytes = self.max_rows * self.row_bytes
        staging = state.take(nbytes)
        try:
            self._spent = True  # the ticket is spent even when the reload fails
            done = self._client.reload(self.ticket, staging.buffer, zero_tail=self.zero_tail)
            rows = self.max_rows if self.zero_tail else min(done.rows, self.max_rows)
            out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            if rows:
                n = rows * self.row_bytes
                out.view(-1).view(torch.uint8)[:n].copy_(staging.bytes[:n])
        finally:
            state.give(staging)
        self._tensor = out
        state.reap()
        return out

    def __del__(self):
        try:
            if not self._spent:
                self._spent = True
                self._state.release_later(self.ticket)
        except Exception:  # interpreter shutdown or a dead daemon: the session end frees it
            pass


# --- The context ----------------------------------------------------------------------------

_tls = threading.local()


def _stack() -> list:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def _active() -> Optional["stash_saved_tensors"]:
    stack = _stack()
    return stack[-1] if stack else None


CountLike = Union[int, torch.Tensor]


class stash_saved_tensors:
    """Stashes the marked tensors autograd saves inside the block (one MoE layer's experts).

    client: a stashd.Client. max_tokens: the layer's static token budget (T_max: the row count
    of every token-major saved buffer, e.g. HybridEP's num_permuted_tokens); a multiple of 32
    when MXFP8 scale_inv tensors are saved. num_tokens: the valid tokens, an int or an integer
    tensor of one element (tokens_per_expert.sum()); only that prefix of rows is stashed, and
    its value is taken when each tensor is saved. name, layer, microbatch: tags the daemon shows
    in stats and logs. zero_tail: reloaded tensors get zeros in rows [valid, max) instead of
    uninitialised memory.

    Counters for tests and logs: stashed, overflowed, passed (tensors left alone).
    """

    def __init__(self, client: Client, max_tokens: int, num_tokens: CountLike, *,
                 name: Optional[str] = None, zero_tail: bool = False, layer: int = 0,
                 microbatch: int = 0):
        if not isinstance(client, Client):
            raise TypeError(f"stash_saved_tensors: client must be a stashd.Client, got "
                            f"{type(client).__name__}")
        max_tokens = int(max_tokens)
        if max_tokens <= 0:
            raise ValueError(f"stash_saved_tensors: max_tokens must be > 0, got {max_tokens}")
        if isinstance(num_tokens, torch.Tensor):
            if num_tokens.numel() != 1 or num_tokens.is_floating_point() or \
                    num_tokens.is_complex():
                raise ValueError("stash_saved_tensors: num_tokens must be an int or an integer "
                                 f"tensor of one element, got {num_tokens.dtype} of shape "
                                 f"{tuple(num_tokens.shape)}")
        elif int(num_tokens) < 0:
            raise ValueError(f"stash_saved_tensors: num_tokens must be >= 0, got {num_tokens}")
        self.client = client
        self.max_tokens = max_tokens
        self.num_tokens = num_tokens
        self.name = name
        self.zero_tail = bool(zero_tail)
        self.layer = int(layer)
        self.microbatch = int(microbatch)
        self.stashed = 0
        self.overflowed = 0
        self.passed = 0
        self._state = _TorchState.of(client)
        self._registry: Dict[Tuple[int, int, int], Tuple[weakref.ref, bool]] = {}
        self._cell: Optional[_Staging] = None
        self._cell_view: Optional[torch.Tensor] = None
        self._hooks: Optional[contextlib.AbstractContextManager] = None

    # --- Registration -----------------------------------------------------------------------

    def register(self, t: torch.Tensor, *, scale_inv: bool = False) -> torch.Tensor:
        """Registers t by storage for this context (see the module function register())."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"stashd.torch.register: expected a tensor, got {type(t).__name__}")
        self._registry[_storage_key(t)] = (weakref.ref(t), bool(scale_inv))
        return t

    def _registered(self, t: torch.Tensor) -> Optional[bool]:
        if not self._registry or not t.is_contiguous():
            return None
        entry = self._registry.get(_storage_key(t))
        if entry is None:
            return None
        ref, scale_inv = entry
        return scale_inv if ref() is not None else None

    # --- Hooks ------------------------------------------------------------------------------

    def __enter__(self) -> "stash_saved_tensors":
        if self._hooks is not None:
            raise RuntimeError("stash_saved_tensors is not reentrant: make a new one per layer")
        if isinstance(self.num_tokens, torch.Tensor):
            self._cell = self._state.take(_COUNT_CELL_BYTES)
            self._cell_view = self._cell.bytes[:_COUNT_CELL_BYTES].view(torch.int64)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
        hooks, self._hooks = self._hooks, None
        self._registry.clear()
        try:
            if hooks is not None:
                hooks.__exit__(*exc)
        finally:
            if self._cell is not None:
                # Every pack waited for its answer, so the daemon has read the cell.
                self._state.give(self._cell)
                self._cell, self._cell_view = None, None
            self._state.reap()

    def _divisor(self, t: torch.Tensor) -> Optional[int]:
        scale_inv = marker(t)
        if scale_inv is None:
            scale_inv = self._registered(t)
        if scale_inv is None:
            return None
        return SCALE_INV_BLOCK_TOKENS if scale_inv else 1

    def _pack(self, t: torch.Tensor):
        # Sparse and other non-strided layouts have no rows (and no storage to match).
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dim() == 0 or \
                t.numel() == 0:
            self.passed += 1
            return t
        divisor = self._divisor(t)
        if divisor is None:
            self.passed += 1
            return t
        return self._stash(t, divisor)

    def _rows(self, t: torch.Tensor, divisor: int) -> Tuple[int, int]:
        what = "an MXFP8 columnwise scale_inv" if divisor > 1 else "token-major data"
        if self.max_tokens % divisor:
            raise ValueError(
                f"stashd.torch: a tensor marked as {what} has one row per {divisor} tokens, but "
                f"max_tokens={self.max_tokens} is not a multiple of {divisor}: pad the token "
                f"budget to a multiple of {divisor} (router padding for quantization)")
        rows = self.max_tokens // divisor
        nbytes = t.numel() * t.element_size()
        if nbytes % rows or (nbytes // rows) % t.element_size():
            raise ValueError(
                f"stashd.torch: a tensor marked as {what} (shape {tuple(t.shape)}, {t.dtype}, "
                f"{nbytes} bytes) does not split into {rows} rows of whole elements (max_tokens="
                f"{self.max_tokens}{f' / {divisor}' if divisor > 1 else ''}): a marked tensor "
                f"must hold exactly one row per token{' block' if divisor > 1 else ''}; check "
                f"max_tokens and what was marked")
        return rows, nbytes // rows

    def _stash_device(self, t: torch.Tensor, rows: int, row_bytes: int, divisor: int):
        """The cuda path: stash straight from GPU memory, ordered on the current stream."""
        state = self._state
        source = t.detach()
        if not source.is_contiguous():
            source = source.contiguous()  # a marked tensor is row-major; this is a copy
        count_tensor = None
        if isinstance(self.num_tokens, torch.Tensor):
            # A private int64 cell on the GPU, filled on the stream (asynchronous): the copy
            # kernel reads it later, the host never does, and the caller may reuse its own
            # count tensor at once (a plain .to() would alias an int64 CUDA tensor).
            count_tensor = torch.empty(1, dtype=torch.int64, device=t.device)
            count_tensor.copy_(self.num_tokens.detach().reshape(1))
            count = dict(device_count=count_tensor.data_ptr())
        else:
            count = dict(count=int(self.num_tokens))
        stream = torch.cuda.current_stream(t.device).cuda_stream
        with state._order:
            ready = state.event(stream, "ready")
            self.client.enqueue_signal(ready, stream)
            ticket = self.client.stash_device(source.data_ptr(), row_bytes=row_bytes,
                                              max_rows=rows, divisor=divisor, layer=self.layer,
                                              microbatch=self.microbatch, name=self.name,
                                              ready=ready, wait=False, **count)
        self.stashed += 1
        handle = StashedTensor(state, ticket, t, rows, rows, row_bytes, divisor, None,
                               self.zero_tail)
        handle._cuda = True
        handle._source = source
        handle._count = count_tensor
        handle._ctx = weakref.ref(self)
        state.track_stash(handle)
        state.reap()
        return handle

    def _stash(self, t: torch.Tensor, divisor: int):
        state = self._state
        rows, row_bytes = self._rows(t, divisor)
        if t.is_cuda and self.client.backend == "cuda":
            return self._stash_device(t, rows, row_bytes, divisor)
        if isinstance(self.num_tokens, torch.Tensor):
            # Host staging: the count goes into the shared cell the daemon reads at copy time.
            # (The cuda path will hand the device scalar itself to the daemon: no sync there.)
            self._cell_view.copy_(self.num_tokens.detach().reshape(1))
            count = (self._cell.buffer, 0)
            tokens = self._cell.buffer.read_int64(0)
        else:
            count = tokens = int(self.num_tokens)
        # Only the valid prefix needs staging; a count past the budget overflows in the daemon.
        valid = min(max(tokens, 0) // divisor, rows)
        staging = state.take(rows * row_bytes)
        try:
            if valid:
                n = valid * row_bytes
                with torch.no_grad():
                    src = t.detach().reshape(-1).view(torch.uint8)
                    staging.bytes[:n].copy_(src[:n])
            done = self.client.stash(staging.buffer, row_bytes=row_bytes, max_rows=rows,
                                      count=count, divisor=divisor, layer=self.layer,
                                      microbatch=self.microbatch, name=self.name)
        finally:
            # The daemon answered (or failed): it no longer reads the staging Buffer.
            state.give(staging)
        if done.overflowed:
            self.overflowed += 1
            return t  # nothing was taken: autograd keeps the tensor itself
        self.stashed += 1
        return StashedTensor(state, done.ticket, t, done.rows, rows, row_bytes, divisor,
                             done.tier, self.zero_tail)


def _unpack(packed):
    if isinstance(packed, StashedTensor):
        return packed.load()
    return packed

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

Not built yet (DESIGN.md §6, the cuda backend): device tensors handed to the daemon by CUDA IPC
with a ready event on the trainer's stream and the count read by the copy kernel from device
memory. That path must stay sync-free: no `.item()` and no host copy of the count in the pack
hook. The staging path here does copy the count tensor to host memory when each tensor is
saved (a device sync for a CUDA count tensor) and stages device tensors through host memory.
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
from stashd.client import Client
from stashd.errors import UNAVAILABLE, StashError, error_for

TE_MARKER_ATTRIBUTE = "grouped_tensor_scale_inv"
STASHD_MARKER_ATTRIBUTE = "stashd_scale_inv"
# MXFP8 keeps one E8M0 scale per 32 values: a columnwise scale_inv has a row per 32 tokens.
SCALE_INV_BLOCK_TOKENS = 32

# Staging buffers are rounded up so that tensors of nearby sizes share one: 8 size classes per
# power of two, at least one 64 KiB granule.
_MIN_STAGING_BYTES = 64 << 10
_COUNT_CELL_BYTES = 8


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

    def reap(self, wait: bool = False) -> None:
        """Collects answered releases (all of them with wait=True)."""
        client = self._live_client()
        if client is None:
            self._releases.clear()
            return
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
    unpacking it (a graph freed before backward): their pages are free when this returns."""
    state = client._extensions.get("torch")
    if state is not None:
        state.reap(wait=True)


# --- The handle autograd keeps instead of a stashed tensor ----------------------------------

class StashedTensor:
    """What the pack hook returns for a stashed tensor: the ticket and what unpack needs to
    rebuild the tensor. Unpacking twice (retain_graph=True) reloads once and hands back the same
    tensor; a handle autograd drops without unpacking releases its pages."""

    __slots__ = ("_state", "_client", "ticket", "shape", "dtype", "device", "rows", "max_rows",
                 "row_bytes", "divisor", "tier", "zero_tail", "_tensor", "_spent", "__weakref__")

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

    def __repr__(self) -> str:
        return (f"<stashd.torch.StashedTensor ticket=0x{self.ticket:x} shape={tuple(self.shape)} "
                f"dtype={self.dtype} rows={self.rows}/{self.max_rows} tier={self.tier.name}>")

    def load(self) -> torch.Tensor:
        """Reloads the rows (once) into a fresh tensor of the original shape, dtype, device."""
        if self._tensor is not None:
            return self._tensor
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

    def _stash(self, t: torch.Tensor, divisor: int):
        state = self._state
        rows, row_bytes = self._rows(t, divisor)
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

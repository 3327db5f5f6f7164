"""stash_saved_tensors: the saved_tensors_hooks context around one MoE layer's experts, and
register(), which marks tensors by storage for the innermost active context."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Dict, Optional, Tuple, Union

import torch

from stashd.client import Client, Tier
from stashd.errors import UNAVAILABLE, StashError
from stashd.torch import checkpointing, hook_errors
from stashd.torch.handle import StashedTensor
from stashd.torch.marking import (SCALE_INV_BLOCK_TOKENS, TE_SCALE_ROW_PADDING, marker,
                                  round_up, scale_rows, storage_key, storage_ref, valid_rows)
from stashd.torch.microbatch import Key, current_microbatch
from stashd.torch.state import COUNT_CELL_BYTES, _Staging, _TorchState

_tls = threading.local()


def _stack() -> list:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def _active() -> Optional["stash_saved_tensors"]:
    stack = _stack()
    return stack[-1] if stack else None


def register(*tensors: Optional[torch.Tensor], scale_inv: bool = False):
    """Registers tensors by storage with this thread's innermost active stash_saved_tensors.

    A saved tensor matches when it is contiguous and covers the same bytes of the same storage:
    views, reshapes, dtype views and detached aliases of a registered tensor all do, and the
    attribute they lost does not matter. A registration lasts as long as the storage does (not
    the tensor object passed in: registering a temporary view works) and ends when the context
    exits; a freed storage's entry is ignored, so reused memory never matches. None entries are
    skipped. Outside a context it does nothing (the stash is off there), so layer code may call
    it unconditionally, as it calls TE's mark_grouped_tensor. Returns the tensor (one argument)
    or the tuple.
    """
    ctx = _active()
    if ctx is None:
        return tensors[0] if len(tensors) == 1 else tensors
    for t in tensors:
        if t is not None:
            ctx.register(t, scale_inv=scale_inv)
    return tensors[0] if len(tensors) == 1 else tensors


CountLike = Union[int, torch.Tensor]


class stash_saved_tensors:
    """Stashes the marked tensors autograd saves inside the block (one MoE layer's experts).

    client: a stashd.Client. max_tokens: the layer's static token budget (T_max: the row count
    of every token-major saved buffer, e.g. HybridEP's num_permuted_tokens). num_tokens: the
    valid tokens, an int or an integer tensor of one element (tokens_per_expert.sum()); only
    that prefix of rows is stashed (ceil(num_tokens / 32) rows of a scale_inv), and its value
    is taken when each tensor is saved. name, layer, microbatch: tags sent with every stash (the
    daemon shows them in stats and logs); (layer, microbatch) is the key of the stash group
    (accounting, prefetch); microbatch=None takes the enclosing stash_torch.microbatch() scope
    (0 outside one). zero_tail: reloaded tensors get zeros in rows [valid, max) instead of
    uninitialised memory.

    Counters for tests and logs: stashed, overflowed (kept in-process: pool full), unavailable
    (kept in-process: no daemon), passed (tensors left alone), registered (register() calls),
    marked (saved tensors that were marked or registered). skipped: why the context installed
    no hooks (None, "no_grad", "recompute", "in_checkpoint", "disabled").
    """

    def __init__(self, client: Client, max_tokens: int, num_tokens: CountLike, *,
                 name: Optional[str] = None, zero_tail: bool = False, layer: int = 0,
                 microbatch: Optional[int] = None):
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
        if microbatch is None:
            microbatch = current_microbatch() or 0
        if int(layer) < 0 or int(microbatch) < 0:
            raise ValueError(f"stash_saved_tensors: layer and microbatch must be >= 0, got "
                             f"layer={layer} microbatch={microbatch}")
        self.client = client
        self.max_tokens = max_tokens
        self.num_tokens = num_tokens
        self.name = name
        self.zero_tail = bool(zero_tail)
        self.layer = int(layer)
        self.microbatch = int(microbatch)
        self.key = Key(self.layer, self.microbatch)
        self.stashed = 0
        self.overflowed = 0
        self.unavailable = 0
        self.passed = 0
        self.registered = 0
        self.marked = 0
        self.skipped: Optional[str] = None
        self._state = _TorchState.of(client)
        self._registry: Dict[Tuple[int, int, int], Tuple[object, bool]] = {}
        self._cell: Optional[_Staging] = None
        self._cell_view: Optional[torch.Tensor] = None
        self._hooks: Optional[contextlib.AbstractContextManager] = None
        self._entered = False
        self._error: Optional[BaseException] = None
        self._errors_since = 0

    def __repr__(self) -> str:
        return f"<stashd.torch.stash_saved_tensors {self.label}>"

    @property
    def label(self) -> str:
        """How warnings and errors name this context."""
        name = f"{self.name!r} " if self.name else ""
        return f"{name}({self.key})"

    # --- Registration -----------------------------------------------------------------------

    def register(self, t: torch.Tensor, *, scale_inv: bool = False) -> torch.Tensor:
        """Registers t by storage for this context (see the module function register())."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"stashd.torch.register: expected a tensor, got {type(t).__name__}")
        self.registered += 1
        if t.layout == torch.strided and t.numel() > 0:
            self._registry[storage_key(t)] = (storage_ref(t), bool(scale_inv))
        return t

    def _registered(self, t: torch.Tensor) -> Optional[bool]:
        if not self._registry or not t.is_contiguous():
            return None
        entry = self._registry.get(storage_key(t))
        if entry is None:
            return None
        ref, scale_inv = entry
        return None if ref.expired() else scale_inv

    # --- Hooks ------------------------------------------------------------------------------

    def __enter__(self) -> "stash_saved_tensors":
        if self._entered:
            raise RuntimeError("stash_saved_tensors is not reentrant: make a new one per layer")
        self._entered = True
        self._errors_since = hook_errors.serial()
        phase = checkpointing.phase()
        if not self._state.enabled or getattr(self._state.client, "disabled", False):
            self.skipped = "disabled"  # overflow_guard's rerun, or $STASHD_DISABLED
        elif phase != checkpointing.Phase.NORMAL:
            self.skipped = phase.value
            if phase == checkpointing.Phase.RECOMPUTE:
                self._state.counters["recompute_skipped"] += 1
            elif phase == checkpointing.Phase.IN_CHECKPOINT:
                self._state.counters["in_checkpoint"] += 1
        if self.skipped is None:
            if isinstance(self.num_tokens, torch.Tensor):
                self._cell = self._state.take(COUNT_CELL_BYTES)
                self._cell_view = self._cell.bytes[:COUNT_CELL_BYTES].view(torch.int64)
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            self._hooks.__enter__()
        _stack().append(self)  # register() works (and does nothing harmful) when skipped
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
        hooks, self._hooks = self._hooks, None
        self._registry.clear()
        try:
            if hooks is not None:
                hooks.__exit__(exc_type, exc, tb)
        finally:
            if self._cell is not None:
                # Every pack waited for its answer, so the daemon has read the cell.
                self._state.give(self._cell)
                self._cell, self._cell_view = None, None
            self._state.reap()
        if exc is not None:
            error = hook_errors.original(exc, self._errors_since)
            if error is not None:
                # PyTorch re-raised a hook's exception as RuntimeError("ValueError: ..."):
                # hand the trainer the original (chained to PyTorch's).
                raise error from exc
            return
        if self.skipped is None and self.stashed == 0 and self.overflowed == 0 and \
                self.unavailable == 0:
            self._warn_nothing_stashed()

    def _warn_nothing_stashed(self) -> None:
        state = self._state
        state.counters["empty_contexts"] += 1
        if self.marked or self.registered:
            why = (f"saw {self.marked} marked or registered saved tensor(s) and "
                   f"{self.registered} register() call(s) but stashed none")
            fix = ("register() matches a saved tensor only when it covers the same bytes of the "
                   "same storage: register the tensor the expert op saves (before slicing it "
                   "per expert), or mark() the saved tensor itself")
        else:
            why = "saw no marked or registered tensor: nothing was stashed"
            fix = ("without Transformer Engine's marker (grouped_tensor_scale_inv), "
                   "stash_torch.mark() or register() the token-major tensors the experts save")
        state.warn_once(("empty", self.name, self.layer),
                        f"stashd.torch: stash_saved_tensors {self.label} {why}; {fix}. (Warned "
                        f"once per context; stash_torch.counters(client)['empty_contexts'] "
                        f"counts them.)")

    def _divisor(self, t: torch.Tensor) -> Optional[int]:
        scale_inv = marker(t)
        if scale_inv is None:
            scale_inv = self._registered(t)
        if scale_inv is None:
            return None
        return SCALE_INV_BLOCK_TOKENS if scale_inv else 1

    def _pack(self, t: torch.Tensor):
        try:
            packed = self._pack_one(t)
            # What stays in-process goes back detached: a saved *output* returned as itself
            # would hold its own grad_fn, a reference cycle through C++ that keeps the whole
            # graph alive after the trainer drops it. Autograd restores the metadata on unpack.
            return packed.detach() if isinstance(packed, torch.Tensor) else packed
        except BaseException as e:
            self._error = e
            hook_errors.record(e)
            raise

    def _pack_one(self, t: torch.Tensor):
        # Sparse and other non-strided layouts have no rows (and no storage to match).
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dim() == 0 or \
                t.numel() == 0:
            self.passed += 1
            return t
        divisor = self._divisor(t)
        if divisor is None:
            self.passed += 1
            return t
        self.marked += 1
        return self._stash(t, divisor)

    def _rows(self, t: torch.Tensor, divisor: int) -> Tuple[int, int]:
        """(rows, row_bytes) of a marked tensor. Data: max_tokens rows. A scale_inv:
        ceil(max_tokens / 32) rows, or that rounded up to a multiple of 4 when the tensor's first
        dimension says so (TE pads MXFP8 columnwise scale_inv rows to a multiple of 4)."""
        nbytes = t.numel() * t.element_size()
        if divisor == 1:
            what, rows, rule = "token-major data", self.max_tokens, f"max_tokens={self.max_tokens}"
        else:
            what = "an MXFP8 columnwise scale_inv"
            rows = scale_rows(self.max_tokens)
            padded = round_up(rows, TE_SCALE_ROW_PADDING)
            rule = (f"ceil(max_tokens / {divisor}) = {rows} (max_tokens={self.max_tokens}), or "
                    f"{padded} padded to a multiple of {TE_SCALE_ROW_PADDING} as TE allocates it")
            if t.dim() >= 2:
                if t.shape[0] not in (rows, padded):
                    raise ValueError(
                        f"stashd.torch: a tensor marked as {what} (shape {tuple(t.shape)}, "
                        f"{t.dtype}) has {t.shape[0]} rows, but one row per {divisor} tokens "
                        f"means {rule}; check max_tokens and what was marked")
                rows = t.shape[0]
        if nbytes % rows or (nbytes // rows) % t.element_size():
            raise ValueError(
                f"stashd.torch: a tensor marked as {what} (shape {tuple(t.shape)}, {t.dtype}, "
                f"{nbytes} bytes) does not split into {rows} rows of whole elements ({rule}): a "
                f"marked tensor must hold exactly one row per token"
                f"{' block' if divisor > 1 else ''}; check max_tokens and what was marked")
        return rows, nbytes // rows

    def _kept(self, t: torch.Tensor, error: StashError):
        """The daemon cannot be reached: keep t in-process, like an overflow."""
        self._state.daemon_lost(error)
        self.unavailable += 1
        self._state.key_stats(self.key).overflowed += 1
        return t

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
        if self.client.on_stream:
            return self._stash_on_stream(t, source, count_tensor, rows, row_bytes, divisor,
                                         count)
        stream = torch.cuda.current_stream(t.device).cuda_stream
        try:
            with state._order:
                ready = state.event(stream, "ready")
                self.client.enqueue_signal(ready, stream)
                ticket = self.client.stash_device(source.data_ptr(), row_bytes=row_bytes,
                                                  max_rows=rows, divisor=divisor,
                                                  layer=self.layer, microbatch=self.microbatch,
                                                  name=self.name, ready=ready, wait=False,
                                                  **count)
        except StashError as e:
            if e.code != UNAVAILABLE:
                raise
            return self._kept(t, e)
        self.stashed += 1
        state.key_stats(self.key).stashed += 1
        handle = StashedTensor(state, ticket, t, rows, rows, row_bytes, divisor, None,
                               self.zero_tail, self.key)
        handle._cuda = True
        handle._source = source
        handle._count = count_tensor
        handle._ctx = weakref.ref(self)
        state.track_stash(handle)
        state.reap()
        return handle

    def _stash_on_stream(self, t: torch.Tensor, source: torch.Tensor,
                         count_tensor: Optional[torch.Tensor], rows: int, row_bytes: int,
                         divisor: int, count: dict):
        """Mapped mode on the cuda backend: the library's kernels page the rows into this
        process's leased chunks on the session's stream, after the kernels that wrote them
        (keep_source=False: autograd holds the handle instead of the tensor, so its memory
        returns to PyTorch's allocator once nothing else holds it, and is reused only after
        the stream passed the stash). A stash that finds no room is known on the GPU only: it
        flags the step, whose backward then reads stale rows, and overflow_guard reruns that
        step with the stash off."""
        try:
            with self._state.on_session_stream(t.device) as stream:
                # Allocated on another stream: reused only after the stash read them.
                source.record_stream(stream)
                if count_tensor is not None:
                    count_tensor.record_stream(stream)
                done = self.client.stash_device(source.data_ptr(), row_bytes=row_bytes,
                                                max_rows=rows, divisor=divisor, layer=self.layer,
                                                microbatch=self.microbatch, name=self.name,
                                                stream=stream.cuda_stream, keep_source=False,
                                                **count)
        except StashError as e:
            if e.code != UNAVAILABLE:
                raise
            return self._kept(t, e)
        stats = self._state.key_stats(self.key)
        if done.overflowed:  # a disabled client: nothing was enqueued
            self.overflowed += 1
            stats.overflowed += 1
            return t
        self.stashed += 1
        stats.stashed += 1
        if "count" in count:  # a count on the GPU is not known here: not counted
            stats.bytes_stashed += min(valid_rows(count["count"], divisor), rows) * row_bytes
        handle = StashedTensor(self._state, done.ticket, t, rows, rows, row_bytes, divisor,
                               Tier.NONE, self.zero_tail, self.key)
        handle._cuda = True
        handle._on_stream = True
        self._state.reap()
        return handle

    def _stash(self, t: torch.Tensor, divisor: int):
        state = self._state
        rows, row_bytes = self._rows(t, divisor)
        if state.lost is not None:
            return self._kept(t, state.lost)
        if t.is_cuda and self.client.backend == "cuda":
            return self._stash_device(t, rows, row_bytes, divisor)
        if self.client.on_stream:
            # The library pages GPU memory only: a CPU tensor stays in-process.
            state.warn_once("cpu-tensor-on-stream",
                            f"stashd.torch: a marked CPU tensor (shape {tuple(t.shape)}) was kept "
                            "in-process: mapped mode on the cuda backend pages CUDA tensors only")
            self.overflowed += 1
            state.key_stats(self.key).overflowed += 1
            return t
        if isinstance(self.num_tokens, torch.Tensor):
            # Host staging: the count goes into the shared cell the daemon reads at copy time.
            # (The cuda path hands the device scalar itself to the daemon: no sync there.)
            self._cell_view.copy_(self.num_tokens.detach().reshape(1))
            count = (self._cell.buffer, 0)
            tokens = self._cell.buffer.read_int64(0)
        else:
            count = tokens = int(self.num_tokens)
        # Only the valid prefix needs staging; a count past the budget overflows in the daemon.
        valid = min(valid_rows(tokens, divisor), rows)
        staging = state.take(rows * row_bytes)
        try:
            if valid:
                n = valid * row_bytes
                with torch.no_grad():
                    src = t.detach()
                    if not src.is_contiguous():
                        # A strided marked tensor (e.g. a column slice) is copied to row-major
                        # first: one extra copy of the tensor.
                        src = src.contiguous()
                    staging.bytes[:n].copy_(src.reshape(-1).view(torch.uint8)[:n])
            done = self.client.stash(staging.buffer, row_bytes=row_bytes, max_rows=rows,
                                      count=count, divisor=divisor, layer=self.layer,
                                      microbatch=self.microbatch, name=self.name)
        except StashError as e:
            if e.code != UNAVAILABLE:
                raise
            return self._kept(t, e)
        finally:
            # The daemon answered (or failed): it no longer reads the staging Buffer.
            state.give(staging)
        stats = state.key_stats(self.key)
        if done.overflowed:
            self.overflowed += 1
            stats.overflowed += 1
            return t  # nothing was taken: autograd keeps the tensor itself
        self.stashed += 1
        stats.stashed += 1
        stats.bytes_stashed += done.bytes
        handle = StashedTensor(state, done.ticket, t, done.rows, rows, row_bytes, divisor,
                               done.tier, self.zero_tail, self.key)
        state.prefetcher.add(handle)
        return handle


def _unpack(packed):
    if not isinstance(packed, StashedTensor):
        return packed
    state = packed._state
    start = time.perf_counter_ns()
    try:
        state.prefetcher.on_unpack(packed)
        return packed.load()
    except BaseException as e:
        hook_errors.record(e)
        raise
    finally:
        state.counters["unpack_us"] += (time.perf_counter_ns() - start) // 1000

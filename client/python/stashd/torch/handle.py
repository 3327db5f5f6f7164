"""StashedTensor: what autograd keeps instead of a stashed tensor, and how it comes back."""

from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch

from stashd.client import Client, Tier
from stashd.errors import NOT_FOUND, UNAVAILABLE, StashError, error_for
from stashd.torch.microbatch import Key
from stashd.torch.state import _Staging, _TorchState


class StashedTensor:
    """What the pack hook returns for a stashed tensor: the ticket, its (layer, microbatch) key
    and what unpack needs to rebuild the tensor. Unpacking twice (retain_graph=True) reloads once
    and hands back the same tensor; a handle autograd drops without unpacking releases its
    pages. A prefetch starts the reload early; unpack then only waits for it."""

    __slots__ = ("_state", "_client", "ticket", "key", "shape", "dtype", "device", "rows",
                 "max_rows", "row_bytes", "divisor", "tier", "zero_tail", "_tensor", "_spent",
                 "_source", "_count", "_ctx", "_cuda", "_on_stream", "_lock", "_prefetch", "read",
                 "__weakref__")

    def __init__(self, state: _TorchState, ticket: int, tensor: torch.Tensor, rows: int,
                 max_rows: int, row_bytes: int, divisor: int, tier, zero_tail: bool,
                 key: Key = Key(0, 0)):
        self._state = state
        self._client = state.client  # the session that holds the pages must outlive the handle
        self.ticket = ticket
        self.key = key
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
        # Mapped mode on the cuda backend: the stash, its reload and release are enqueued on the
        # session's stream (_TorchState.on_session_stream).
        self._on_stream = False
        self._lock = threading.Lock()  # one thread collects an answer or starts a reload
        # A reload started by prefetch(): (op, staging) until load() collects it.
        self._prefetch: Optional[Tuple[int, _Staging]] = None
        self.read = False  # backward asked for it (load() was called)

    def __repr__(self) -> str:
        tier = "pending" if self.tier is None else self.tier.name
        return (f"<stashd.torch.StashedTensor {self.key} ticket=0x{self.ticket:x} "
                f"shape={tuple(self.shape)} dtype={self.dtype} rows={self.rows}/{self.max_rows} "
                f"tier={tier}>")

    @property
    def pending(self) -> bool:
        """True while the daemon holds the rows and nobody has started reloading them."""
        return not self._spent and self._tensor is None

    # --- The cuda path ----------------------------------------------------------------------

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
            stats = self._state.key_stats(self.key, create=False)
            stats.stashed -= 1
            stats.overflowed += 1
            return True
        self.tier = done.tier
        self.rows = done.rows
        self._source = None  # the daemon holds the rows: the memory goes back to the allocator
        return True

    def _load_on_stream(self) -> torch.Tensor:
        """Mapped mode on the cuda backend: the library's kernels reload the rows on the
        session's stream, ordered with the current one (the same stream in the usual case)."""
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self._spent = True  # the ticket is spent even when the reload fails
        with self._state.on_session_stream(self.device) as stream:
            out.record_stream(stream)  # allocated on the current stream, written on this one
            try:
                self._client.reload_device(self.ticket, out.data_ptr(), zero_tail=self.zero_tail,
                                           stream=stream.cuda_stream, wait=False)
            except StashError as e:
                raise self._lost(e) from e
        self._state.key_stats(self.key, create=False).reloaded += 1
        return out

    def _load_device(self) -> torch.Tensor:
        """The cuda path: reload into a fresh tensor, ordered on the current stream."""
        if self._on_stream:
            return self._load_on_stream()
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
        state.key_stats(self.key, create=False).reloaded += 1
        return out

    # --- The host path ----------------------------------------------------------------------

    def _lost(self, error: StashError) -> StashError:
        """The error backward gets when the rows cannot come back."""
        if error.code == UNAVAILABLE or self._state.lost is not None:
            self._state.daemon_lost(error)  # later stashes stay in-process; the step is flagged
            return error_for(UNAVAILABLE,
                             f"stashd.torch: cannot reload the stash of {self.key} (shape "
                             f"{tuple(self.shape)}, {self.dtype}): the daemon that held its rows "
                             f"is gone ({error}). In daemon-copy mode the data lived in the "
                             "daemon, so this backward cannot be computed: rerun the step with "
                             "the stash off (stash_torch.overflow_guard does) after restarting "
                             "or without the daemon")
        if error.code == NOT_FOUND:
            return error_for(NOT_FOUND,
                             f"stashd.torch: the daemon has no stash for {self.key} (ticket "
                             f"0x{self.ticket:x}, shape {tuple(self.shape)}): it was never "
                             f"stashed in this session or was released already ({error})")
        return error_for(error.code, f"stashd.torch: the reload of {self.key} (shape "
                         f"{tuple(self.shape)}) failed: {error}")

    def prefetch(self) -> bool:
        """Starts the reload into a staging Buffer without waiting (host path). Returns False
        when there is nothing to start (cuda path, kept in-process, already reloading)."""
        if self._cuda:
            return False
        with self._lock:
            if not self.pending:
                return False
            staging = self._state.take(self.max_rows * self.row_bytes)
            try:
                op = self._client.reload(self.ticket, staging.buffer, zero_tail=self.zero_tail,
                                         wait=False)
            except StashError:
                self._state.give(staging)
                return False  # load() retries it and raises with the key
            self._spent = True
            self._prefetch = (op, staging)
        self._state.key_stats(self.key, create=False).prefetched += 1
        return True

    def load(self) -> torch.Tensor:
        """Reloads the rows (once) into a fresh tensor of the original shape, dtype, device;
        waits for a prefetched reload instead of starting one."""
        self.read = True
        if self._tensor is not None:
            return self._tensor
        if self._cuda:
            out = self._load_device()
            self._tensor = out
            self._state.reap()
            return out
        state = self._state
        with self._lock:
            prefetched, self._prefetch = self._prefetch, None
            if prefetched is None and self._spent:
                raise error_for(NOT_FOUND, f"stashd.torch: the stash of {self.key} was spent "
                                "already (released, or its reload failed before)")
            self._spent = True  # the ticket is spent even when the reload fails
        if prefetched is not None:
            op, staging = prefetched
        else:
            op, staging = None, state.take(self.max_rows * self.row_bytes)
        try:
            try:
                if op is None:
                    done = self._client.reload(self.ticket, staging.buffer,
                                               zero_tail=self.zero_tail)
                else:
                    done = self._client.wait(op)
            except StashError as e:
                raise self._lost(e) from e
            rows = self.max_rows if self.zero_tail else min(done.rows, self.max_rows)
            out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            if rows:
                n = rows * self.row_bytes
                out.view(-1).view(torch.uint8)[:n].copy_(staging.bytes[:n])
        finally:
            state.give(staging)
        self._tensor = out
        state.key_stats(self.key, create=False).reloaded += 1
        state.reap()
        return out

    def __del__(self):
        try:
            prefetched, self._prefetch = self._prefetch, None
            if prefetched is not None:
                self._state.orphan(*prefetched)  # read by nobody: its pages are free already
                self._state.key_stats(self.key, create=False).reloaded += 1
            elif not self._spent:
                self._spent = True
                self._state.key_stats(self.key, create=False).released += 1
                if self._state.lost is None:
                    self._state.release_later(self.ticket)
        except Exception:  # interpreter shutdown or a dead daemon: the session end frees it
            pass

"""What stashd.torch keeps per Client: staging Buffers, unanswered operations, step flags,
per-(layer, microbatch) accounting and the prefetcher."""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from stashd.buffer import Buffer
from stashd.client import Client
from stashd.errors import UNAVAILABLE, StashError, error_for
from stashd.torch.marking import as_tensor
from stashd.torch.microbatch import Key, KeyStats
from stashd.torch.prefetch import DEFAULT_DEPTH, Prefetcher

if TYPE_CHECKING:
    from stashd.torch.handle import StashedTensor

# Staging buffers are rounded up so that tensors of nearby sizes share one: 8 size classes per
# power of two, at least one 64 KiB granule.
_MIN_STAGING_BYTES = 64 << 10
COUNT_CELL_BYTES = 8
# Event counters of the cuda path: one per (stream, ready|done).
_EVENT_SLOTS = 512


class StashWarning(UserWarning):
    """stashd.torch saw something that makes the stash do nothing (or less than asked)."""


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
    """What stashd.torch keeps per Client: a pool of staging Buffers by size class, the
    release operations of stashes autograd dropped without unpacking them, the step flag
    `unavailable`, the accounting per (layer, microbatch) and the prefetcher.

    Staging Buffers are never freed before the session ends: the daemon maps each Buffer once
    and keeps the mapping for the whole session, so freeing one here would save nothing. Pack
    and unpack each hold one Buffer only until the daemon answers (a prefetched reload until
    backward reads it), so the pool holds about one Buffer per size class and reload in flight.
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
        # Prefetched reloads whose handle autograd dropped: (op, staging) until answered.
        self._orphans: Deque[Tuple[int, _Staging]] = collections.deque()
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
        # Mapped mode on the cuda backend: the torch.cuda.Stream every operation of the session
        # is enqueued on (the library's rings have one writer, so the operations must run one
        # after another): PyTorch's current stream at the last begin_step, or at the first
        # operation. None until then.
        self.stream = None
        # False while overflow_guard reruns a step with the stash off; `guarded` once an
        # overflow_guard runs this client's steps.
        self.enabled = True
        self.guarded = False
        # The daemon could not be reached: the first error (None while it could). Once set,
        # stashes are not tried again until the next step (whose begin_step reconnects once a
        # daemon answers); `step_unavailable` is the step flag.
        self.lost: Optional[StashError] = None
        self.step_unavailable = False
        # Counters of what made a context stash nothing (see counters()).
        self.counters: Dict[str, int] = collections.Counter()
        self._warned: set = set()
        self.accounting: Dict[Key, KeyStats] = {}
        self.prefetcher = Prefetcher(self)

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

    # --- Steps, flags, warnings -------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Client.begin_step calls this: the step flag and the accounting start over, and a
        lost daemon is tried again (the library reconnects at begin_step once one answers; a
        begin_step that finds none raises Unavailable, and overflow_guard flags the step)."""
        self.step_unavailable = False
        client = self._live_client()
        if client is not None and client.on_stream and not self.guarded:
            self._warn_if_the_step_overflowed(client)
        if client is not None and client.on_stream and torch.cuda.is_initialized():
            # The session moves to the stream this step begins on, after the old one's work.
            current = torch.cuda.current_stream(client.device)
            if self.stream is not None and self.stream != current:
                current.wait_stream(self.stream)
            self.stream = current
        if self.lost is not None:
            self.lost = None
            with self._lock:
                self._warned.discard("unavailable")  # each outage warns once
        with self._lock:
            self.accounting = {}
        self.prefetcher.begin_step()

    def _warn_if_the_step_overflowed(self, client: Client) -> None:
        """Mapped mode on the cuda backend without overflow_guard: a step whose stash found no
        room read stale rows in backward. Said once, loudly: the flags are there as far as the
        GPU got (a trainer that read its loss synchronized the stream)."""
        try:
            overflowed = client.step_flags().overflow
        except StashError:
            return
        if overflowed:
            self.warn_once("unguarded-overflow",
                           "stashd.torch: a step overflowed in mapped mode on the cuda backend: "
                           "a stash found no room in the lease, so that step's backward read "
                           "stale rows and its gradients are wrong. Run the steps under "
                           "stash_torch.overflow_guard (it reruns such a step with the stash "
                           "off), or lease more (stashd.connect(lease=...), stashd "
                           "--max-lease-bytes)")

    @contextlib.contextmanager
    def on_session_stream(self, device) -> Iterator["torch.cuda.Stream"]:
        """Mapped mode on the cuda backend: yields the session's stream (self.stream), ordered
        after the work the current stream has enqueued so far; when they differ, the current
        stream's later work waits for what was enqueued on it. Tensors allocated on the current
        stream and used on the yielded one need record_stream()."""
        current = torch.cuda.current_stream(device)
        if self.stream is None:
            self.stream = current
        stream = self.stream
        if stream == current:
            yield stream
            return
        stream.wait_stream(current)
        yield stream
        current.wait_stream(stream)

    def step_flags(self) -> Dict[str, bool]:
        return {"unavailable": self.step_unavailable}

    def key_stats(self, key: Key, create: bool = True) -> KeyStats:
        """This step's counters of `key`. create=False (reloads, releases): a key that did not
        stash in this step (a handle left from an earlier step) gets a scratch KeyStats, so the
        step's accounting never shows more reloads than stashes."""
        with self._lock:
            stats = self.accounting.get(key)
            if stats is None:
                stats = KeyStats()
                if create:
                    self.accounting[key] = stats
            return stats

    def warn_once(self, what: str, message: str) -> None:
        """Warns (StashWarning) the first time `what` happens on this client."""
        with self._lock:
            if what in self._warned:
                return
            self._warned.add(what)
        warnings.warn(message, StashWarning, stacklevel=4)

    def daemon_lost(self, error: StashError) -> None:
        """A stash could not reach the daemon: later stashes stay in-process for this session."""
        self.step_unavailable = True
        self.counters["unavailable_stashes"] += 1
        if self.lost is None:
            self.lost = error
        self.warn_once("unavailable", "stashd.torch: the stash daemon cannot be reached "
                       f"({error}); activations stay in this process for the rest of the step "
                       "(the step flag `unavailable` is set: client.step_flags().unavailable), "
                       "and the next begin_step reconnects once a daemon answers. Stashes "
                       "taken before it went cannot be reloaded in daemon-copy mode: that "
                       "backward raises; rerun the step with the stash off "
                       "(stash_torch.overflow_guard does).")

    # --- Staging ----------------------------------------------------------------------------

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
        """Queues a release without blocking (safe from __del__ on any thread); in mapped mode
        on the cuda backend, on the session's stream."""
        client = self._live_client()
        if client is None:
            return  # the session is over: the daemon returned the pages already
        on = self.stream.cuda_stream if client.on_stream and self.stream is not None else None
        self._releases.append(client.release(ticket, stream=on, wait=False))

    def orphan(self, op: int, staging: _Staging) -> None:
        """A prefetched reload nobody will read: its staging returns once it is answered."""
        self._orphans.append((op, staging))

    def event(self, stream: int, kind: str) -> Tuple[Buffer, int, int]:
        """The next value of the (stream, kind) counter; hold `_order` until it is used."""
        if self._events is None:
            self._events = self.take(_EVENT_SLOTS * COUNT_CELL_BYTES)
            self._events.bytes.zero_()
        slot = self._slots.get((stream, kind))
        if slot is None:
            if len(self._slots) == _EVENT_SLOTS:
                raise RuntimeError(f"stashd.torch: more than {_EVENT_SLOTS // 2} CUDA streams "
                                   "stash or reload through one client")
            slot = self._slots[(stream, kind)] = len(self._slots)
        value = self._values[slot] = self._values.get(slot, 0) + 1
        return (self._events.buffer, slot * COUNT_CELL_BYTES, value)

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

    def _reap_ops(self, client: Client, ops: Deque, wait: bool, done=None) -> None:
        for _ in range(len(ops)):
            try:
                item = ops.popleft()
            except IndexError:  # another thread reaped it
                break
            op = item[0] if isinstance(item, tuple) else item
            try:
                if wait:
                    client.wait(op)
                elif client.poll(op) is None:
                    ops.append(item)
                    continue
            except StashError:
                # A refused release or reload holds no pages (the daemon did not know the
                # ticket, or the session is gone): nothing to give back, and no caller to tell.
                pass
            if done is not None:
                done(item)

    def reap(self, wait: bool = False) -> None:
        """Collects answered releases and orphaned prefetches (all of them with wait=True), and
        the cuda path's answers: raises the first failed reload."""
        client = self._live_client()
        if client is None:
            self._releases.clear()
            self._pending.clear()
            self._reloads.clear()
            self._orphans.clear()
            return
        if self.lost is not None:
            wait = False  # nothing will answer
        self._settle(client, wait)
        self._reap_ops(client, self._releases, wait)
        self._reap_ops(client, self._orphans, wait, done=lambda item: self.give(item[1]))

    def close(self) -> None:
        """Frees every staging Buffer (the client calls this after its session ended)."""
        with self._lock:
            staging, self._all, self._free = self._all, [], {}
        for s in staging:
            s.bytes = None
            s.buffer.free()
        self._releases.clear()
        self._orphans.clear()


def set_prefetch(client: "Client", depth: int = DEFAULT_DEPTH,
                 schedule: Optional[Sequence[Tuple[int, int]]] = None) -> None:
    """Configures prefetch for this client. depth: how many (layer, microbatch) groups ahead of
    the one backward is in get their reloads started (0 = off: each reload runs inside its
    unpack; default 1). schedule: the backward order of (layer, microbatch) keys, for pipeline
    schedules that switch microbatches (None = each microbatch's layers in reverse)."""
    depth = int(depth)
    if depth < 0:
        raise ValueError(f"stashd.torch.set_prefetch: depth must be >= 0, got {depth}")
    prefetcher = _TorchState.of(client).prefetcher
    prefetcher.depth = depth
    prefetcher.schedule = None if schedule is None else [Key(int(l), int(m))
                                                         for l, m in schedule]


def prefetch(client: "Client", layer: int, microbatch: int = 0) -> int:
    """Starts the reloads of every stash of (layer, microbatch) now, e.g. from a pipeline
    schedule right before that microbatch's backward. Returns how many started. Raises
    StashError NOT_FOUND naming the layer and the microbatch when that key never stashed."""
    return _TorchState.of(client).prefetcher.prefetch(Key(int(layer), int(microbatch)))


def flush(client: Client) -> None:
    """Waits until the daemon has answered the release of every stash autograd dropped without
    unpacking it (a graph freed before backward): their pages are free when this returns. On the
    cuda path it also waits for every stash and reload answer and raises the first failed
    reload; in mapped mode on the cuda backend it synchronizes the session's stream, so that
    step_flags() has the whole step's: call it before optimizer.step()."""
    state = client._extensions.get("torch")
    if state is not None:
        state.reap(wait=True)
    if client.on_stream and not getattr(client, "disabled", False) and \
            torch.cuda.is_initialized():
        # Mapped mode on the cuda backend: the step's flags reach the host as the GPU runs its
        # stashes (all on the session's stream); overflow_guard reads them next.
        stream = state.stream if state is not None and state.stream is not None else \
            torch.cuda.current_stream(client.device)
        stream.synchronize()


def empty_cache(client: Client) -> None:
    """torch.cuda.empty_cache() that works with stashd: waits for every pending answer
    (flush), has the daemon close its mappings of this process's GPU allocations, then empties
    PyTorch's cache. Without the middle step, segments the daemon has open stay allocated."""
    flush(client)
    client.release_device_mappings()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def counters(client: Client) -> Dict[str, int]:
    """What stashd.torch counted on this client: `empty_contexts` (contexts that stashed
    nothing, each warned about once per name), `recompute_skipped` (contexts entered during a
    checkpoint's recompute), `in_checkpoint` (contexts inside a non-reentrant checkpoint),
    `unavailable_stashes` (tensors kept because the daemon could not be reached), `unpack_us`
    (microseconds backward spent inside the unpack hook of stashed tensors: starting
    prefetches, waiting for reloads, copying rows out; what prefetch takes off the critical
    path)."""
    return dict(_TorchState.of(client).counters)


def accounting(client: Client) -> Dict[Key, KeyStats]:
    """This step's counters per (layer, microbatch) key (since the last client.begin_step)."""
    state = _TorchState.of(client)
    with state._lock:
        return {k: KeyStats(**vars(v)) for k, v in state.accounting.items()}

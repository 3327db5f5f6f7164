"""Prefetch: start the reloads of the next layers' stashes while backward computes this one.

Without prefetch a reload runs inside the unpack hook, so its whole latency (the request, the
daemon's copy, the answer) sits on backward's critical path. With prefetch, the first unpack of
a (layer, microbatch) group starts the reloads of the rest of that group and of the next
`depth` groups in schedule order; their unpacks then only wait for answers that are usually
there (on the cuda path the unpack is a stream wait already, so prefetch is a host-path gain).
This is Megatron's pre-backward hook, keyed by the unpack itself, so it needs no module hooks.

Schedule order: by default the next groups are the same microbatch's earlier layers, latest
first (backward runs a microbatch's layers in reverse). A pipeline schedule that moves to
another microbatch (1F1B, interleaved) says so with set_prefetch(client, schedule=[...]): the
backward order of (layer, microbatch) keys; or it calls prefetch(client, layer, microbatch)
itself, e.g. right before a microbatch's backward.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence

from stashd.errors import NOT_FOUND, error_for
from stashd.torch.microbatch import Key

if TYPE_CHECKING:
    from stashd.torch.handle import StashedTensor
    from stashd.torch.state import _TorchState

DEFAULT_DEPTH = 1
_PRUNE_AT = 256


class Prefetcher:
    """Groups of live stashes by key, in forward order, and the reloads started ahead."""

    def __init__(self, state: "_TorchState"):
        self._state = weakref.ref(state)
        self._lock = threading.Lock()
        self.depth = DEFAULT_DEPTH
        self.schedule: Optional[List[Key]] = None
        # key -> handles in save order (weak: autograd owns them); dict order = forward order.
        self._groups: Dict[Key, List[weakref.ref]] = {}
        self._current: Optional[Key] = None

    def begin_step(self) -> None:
        with self._lock:
            self._groups = {k: v for k, v in self._groups.items() if _live(v)}
            self._current = None

    def add(self, handle: "StashedTensor") -> None:
        with self._lock:
            refs = self._groups.get(handle.key)
            if refs is None:
                if len(self._groups) >= _PRUNE_AT:  # no begin_step: drop finished groups
                    self._groups = {k: v for k, v in self._groups.items() if _live(v)}
                refs = self._groups[handle.key] = []
            elif len(refs) >= _PRUNE_AT:
                refs[:] = [r for r in refs if r() is not None]
            refs.append(weakref.ref(handle))

    def keys(self) -> List[Key]:
        with self._lock:
            return [k for k, v in self._groups.items() if _live(v)]

    def _next_keys(self, current: Key) -> List[Key]:
        """The `depth` keys after `current` in schedule order that backward has not read yet,
        their reloads started or not: started ones count toward the depth, so the reloads in
        flight stay `depth` groups ahead instead of running further ahead at every group."""
        if self.schedule is not None:
            try:
                order = self.schedule[self.schedule.index(current) + 1:]
            except ValueError:
                order = []
        else:
            forward = [k for k in self._groups if k.microbatch == current.microbatch]
            try:
                order = list(reversed(forward[:forward.index(current)]))
            except ValueError:
                order = []
        return [k for k in order if _unread(self._groups.get(k, ()))][:self.depth]

    def _start(self, keys: Iterable[Key]) -> int:
        started = 0
        for key in keys:
            with self._lock:
                refs = list(self._groups.get(key, ()))
            for ref in refs:
                handle = ref()
                if handle is not None and handle.prefetch():
                    started += 1
        return started

    def on_unpack(self, handle: "StashedTensor") -> None:
        """Backward reached `handle`: entering a new group starts its siblings and the next
        groups' reloads."""
        if self.depth <= 0:
            return
        with self._lock:
            if self._current == handle.key:
                return
            self._current = handle.key
            upcoming = self._next_keys(handle.key)
        self._start([handle.key, *upcoming])

    def prefetch(self, key: Key) -> int:
        with self._lock:
            known = key in self._groups
            stashed = sorted(self._groups)
        if not known:
            shown = ", ".join(str(k) for k in stashed[:16]) or "none"
            raise error_for(NOT_FOUND, f"stashd.torch.prefetch: {key} was never stashed on "
                            f"this client (stashed: {shown}); check the layer= and microbatch= "
                            "of its stash_saved_tensors and the schedule")
        return self._start([key])


def _live(refs: Sequence[weakref.ref]) -> bool:
    return any(r() is not None and r().pending for r in refs)


def _unread(refs: Sequence[weakref.ref]) -> bool:
    """Whether backward has yet to read a stash of the group (reloading or not)."""
    return any(r() is not None and not r().read for r in refs)

"""Pipeline microbatches: the (layer, microbatch) key of every stash, its accounting, and the
microbatch scope a pipeline schedule sets around one microbatch's forward.

Megatron keys its paged stash by (vp_stage, layer, microbatch) and reloads in the pipeline
schedule's order (FFF-BBB, 1F1B, interleaved). stashd.torch keys each stash context by
(layer, microbatch): `layer` comes from the context, `microbatch` from the context or, when
the context does not give one, from the innermost `with stash_torch.microbatch(m):` on this
thread (0 outside any). Backward may run the keys in any order; the accounting per key says
what each one holds, and prefetch follows the schedule (see prefetch.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator, NamedTuple, Optional


class Key(NamedTuple):
    """A stash group: one layer of one microbatch."""

    layer: int
    microbatch: int

    def __str__(self) -> str:
        return f"layer {self.layer} microbatch {self.microbatch}"


@dataclasses.dataclass
class KeyStats:
    """What one (layer, microbatch) did this step (counters since the last begin_step)."""

    stashed: int = 0        # tensors the daemon took
    overflowed: int = 0     # tensors kept in-process (pool full, daemon unreachable)
    reloaded: int = 0       # stashes copied back (prefetched ones included)
    prefetched: int = 0     # reloads started before backward asked for them
    released: int = 0       # stashes dropped unread (their graph was freed)
    bytes_stashed: int = 0  # payload bytes the daemon took (valid rows only)

    @property
    def live(self) -> int:
        """Stashes still held by the daemon for this key."""
        return self.stashed - self.reloaded - self.released


_tls = threading.local()


def current_microbatch() -> Optional[int]:
    """The microbatch of the innermost `microbatch()` scope on this thread (None: none)."""
    stack = getattr(_tls, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def microbatch(index: int) -> Iterator[int]:
    """Stash contexts created inside (that give no microbatch=) belong to microbatch `index`.

    Put it where a pipeline schedule runs one microbatch's forward (Megatron's forward_step):

        with stash_torch.microbatch(m):
            output = model(batch[m])
    """
    index = int(index)
    if index < 0:
        raise ValueError(f"stashd.torch.microbatch: the index must be >= 0, got {index}")
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    stack.append(index)
    try:
        yield index
    finally:
        stack.pop()

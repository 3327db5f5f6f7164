"""overflow_guard: Megatron's paged-stash runner for stashd. Runs a training step, all-reduces
the step flags over a process group so every rank takes the same branch, and reruns the step
with the stash off when any rank overflowed or lost its daemon.

In daemon-copy mode and mapped mode on the host backend, overflow costs memory, never
correctness: an overflowed tensor stays in the trainer's process and backward uses it, so the
gradients of an overflowed step are exact. In mapped mode on the cuda backend the GPU alone sees
the overflow, after the tensor's memory went back to PyTorch: that step's backward reads stale
rows, and the rerun is what makes the step exact (flush synchronizes the stream first, so the
flag is there). What the trainer may
not afford is the memory: on a GPU an overflowed activation keeps its worst-case-sized buffer.
A rerun of the same step would overflow again the same way (same data, same pool), so the
guard reruns with what changes the outcome: the stash off for that one step (nothing is sent,
nothing can overflow; memory as without stashd). A daemon that died mid-step is handled the same
way: backward of the stashes it held raises, and the rerun with the stash off recomputes the
step without it; the next step's begin_step reconnects to the restarted daemon, so every later
step runs once. A drained daemon (stashctl drain) costs no rerun: the rank keeps its tensors
without a flag. (In mapped mode with an automatic lease, the next begin_step also grows the lease
to the overflowed step's demand, so the same overflow does not come back.)

    guard = stash_torch.overflow_guard(client, group=torch.distributed.group.WORLD,
                                       on_rerun=lambda: optimizer.zero_grad(set_to_none=True))
    for step, batch in enumerate(loader):
        result = guard.run(step, lambda: model(batch).loss.backward())
        optimizer.step()
        if result.reran: log(f"step {step} reran: {result}")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch

from stashd.client import Client
from stashd.errors import UNAVAILABLE, StashError
from stashd.torch.state import _TorchState, flush

# The flags all-reduced (SUM) in one int32 tensor, in this order.
FLAGS = ("overflow", "spilled", "unavailable")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What overflow_guard.run did with one step."""

    step: int
    attempts: int            # 1, or 2 when the step was rerun with the stash off
    ranks_overflowed: int    # ranks whose first attempt overflowed (all-reduced)
    ranks_spilled: int       # ranks whose first attempt spilled to the host tier
    ranks_unavailable: int   # ranks whose first attempt could not reach the daemon
    output: Any              # what the step function returned in the last attempt

    @property
    def reran(self) -> bool:
        return self.attempts > 1


class overflow_guard:
    """Runs steps so that an overflow (or a lost daemon) on any rank reruns the step on every
    rank with the stash off.

    client: this rank's stashd.Client. group: the torch.distributed process group whose ranks
    must take the same branch (None: the default group when torch.distributed is initialized,
    else this process alone). on_rerun: called before the rerun, to undo the first attempt
    (zero the gradients, reset what the step changed); the rerun must compute the same step.
    rerun_on: which all-reduced flags trigger the rerun ("overflow", "unavailable"; "spilled"
    only costs copy time and is not a reason by default).
    """

    def __init__(self, client: Client, group=None, *,
                 on_rerun: Optional[Callable[[], None]] = None,
                 rerun_on: Sequence[str] = ("overflow", "unavailable")):
        if not isinstance(client, Client):
            raise TypeError(f"overflow_guard: client must be a stashd.Client, got "
                            f"{type(client).__name__}")
        unknown = set(rerun_on) - set(FLAGS)
        if unknown:
            raise ValueError(f"overflow_guard: rerun_on takes {FLAGS}, got {sorted(unknown)}")
        self.client = client
        self.group = group
        self.on_rerun = on_rerun
        self.rerun_on = tuple(rerun_on)
        self._state = _TorchState.of(client)
        self._state.guarded = True

    def _distributed(self) -> bool:
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized()

    def _all_reduce(self, local: Sequence[int]) -> Sequence[int]:
        flags = torch.tensor([int(v) for v in local], dtype=torch.int32)
        if self.group is not None or self._distributed():
            backend = torch.distributed.get_backend(self.group)
            if backend == "nccl":
                flags = flags.cuda()
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.SUM,
                                         group=self.group)
        return [int(v) for v in flags.cpu()]

    def _begin(self, step: int) -> None:
        try:
            self.client.begin_step(step)
        except StashError as e:
            if e.code != UNAVAILABLE:
                raise
            self._state.daemon_lost(e)

    def _attempt(self, step: int, fn: Callable[..., Any], args, kwargs):
        """Runs one attempt; returns (output, local flags). A lost daemon's reload error is a
        flag, not an exception, so every rank reaches the all-reduce."""
        self._begin(step)
        output = None
        try:
            output = fn(*args, **kwargs)
            flush(self.client)
        except Exception as e:  # PyTorch wraps hook errors in RuntimeError
            if self._state.lost is None:
                raise
            self._state.step_unavailable = True
            output = e
        try:
            flags = self.client.step_flags()
            local = [flags.overflow, flags.spilled, flags.unavailable]
        except StashError:
            local = [False, False, True]
        local[2] = local[2] or self._state.step_unavailable
        return output, local

    def run(self, step: int, fn: Callable[..., Any], *args, **kwargs) -> StepResult:
        """Calls client.begin_step(step) and fn(*args, **kwargs) (forward and backward of the
        step), all-reduces the flags and, when a flag in rerun_on is set on any rank, calls
        on_rerun() and fn once more with the stash off. Returns what happened."""
        output, local = self._attempt(step, fn, args, kwargs)
        summed = dict(zip(FLAGS, self._all_reduce(local)))
        attempts = 1
        if any(summed[name] for name in self.rerun_on):
            attempts = 2
            if self.on_rerun is not None:
                self.on_rerun()
            self._state.enabled = False
            try:
                self._begin(step)
                output = fn(*args, **kwargs)
            finally:
                self._state.enabled = True
        elif isinstance(output, Exception):
            raise output
        return StepResult(step=int(step), attempts=attempts,
                          ranks_overflowed=summed["overflow"], ranks_spilled=summed["spilled"],
                          ranks_unavailable=summed["unavailable"], output=output)

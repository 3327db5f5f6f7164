"""A client that stashes nothing: what connect() returns when $STASHD_DISABLED says the job runs
without a stash (the Slurm task prolog sets it when the prolog could not start stashd).

Every stash answers OVERFLOW at once ("nothing was taken: keep using the source"), which every
caller already handles by keeping its data, so training runs as it would without stashd. The
step flags stay clear, so overflow_guard does not rerun steps; stashd.torch's contexts pass
tensors through untouched. It needs no daemon and no libstash_client.so. It says so once per
process (a DisabledWarning).
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from typing import Dict, Optional, Union

from stashd import _lib
from stashd.client import Client, Completion, SessionInfo, Stats, StepFlags, Tier
from stashd.errors import NOT_FOUND, error_for

ENV = "STASHD_DISABLED"
_OFF = ("", "0", "false", "no", "off")

_warned = False
_warned_lock = threading.Lock()


class DisabledWarning(UserWarning):
    """stashd.connect() returned a client that stashes nothing ($STASHD_DISABLED)."""


def disabled_reason() -> Optional[str]:
    """Why connect() hands out a DisabledClient, or None when $STASHD_DISABLED is unset or
    0/false/no/off."""
    value = os.environ.get(ENV, "")
    if value.strip().lower() in _OFF:
        return None
    return (f"${ENV}={value}: this job runs without a stash (under Slurm: the prolog could not "
            "start stashd on this node; see /var/log/stashd/stashd-job-<id>.log)")


def _warn_once(reason: str) -> None:
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(f"stashd: {reason}. stashd.connect() returned a client that stashes nothing: "
                  "activations stay in the trainer's memory, the results are the same.",
                  DisabledWarning, stacklevel=4)


def _nothing(op: int = 0, tier: Tier = Tier.NONE) -> Completion:
    return Completion(ticket=op, tier=tier, rows=0, bytes=0, pages=0, latency_us=0,
                      step_overflow=False, step_spilled=False)


class DisabledClient(Client):
    """Client's interface, stashing nothing. `disabled` is True and `reason` says why."""

    disabled = True

    def __init__(self, reason: str, socket: Optional[str], backend: str = "host",
                 mode: str = "daemon-copy"):
        # No library and no session: Client.__init__ is not called.
        self._handle = None
        self._closed = False
        self.socket = socket
        self.backend = backend
        self.mode = mode
        self.device = 0
        self.reason = reason
        self._extensions: dict = {}
        self._ops = itertools.count(1)
        self._answers: Dict[int, Completion] = {}
        self._lock = threading.Lock()
        _warn_once(reason)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for ext in list(self._extensions.values()):
            closer = getattr(ext, "close", None)
            if closer is not None:
                closer()
        self._extensions.clear()

    def __repr__(self) -> str:
        return f"<stashd.DisabledClient ({self.reason}){' closed' if self._closed else ''}>"

    def _answer(self, completion_tier: Tier, wait: bool) -> Union[Completion, int]:
        with self._lock:
            op = next(self._ops)
            answer = _nothing(op, completion_tier)
            if not wait:
                self._answers[op] = answer
        return answer if wait else op

    def _not_a_stash(self, ticket: int):
        return error_for(NOT_FOUND, f"stashd: ticket {int(ticket)} is not a stash: this client "
                                    f"stashes nothing ({self.reason})")

    # Every stash overflows: the caller keeps its data.
    def stash(self, source, *, wait: bool = True, **_kwargs) -> Union[Completion, int]:
        return self._answer(Tier.OVERFLOW, wait)

    def stash_device(self, pointer: int, *, wait: bool = True,
                     **_kwargs) -> Union[Completion, int]:
        return self._answer(Tier.OVERFLOW, wait)

    def reload(self, ticket: int, destination=None, **_kwargs):
        raise self._not_a_stash(ticket)

    def reload_device(self, ticket: int, pointer: int = 0, **_kwargs):
        raise self._not_a_stash(ticket)

    def release(self, ticket: int, **_kwargs):
        raise self._not_a_stash(ticket)

    def enqueue_signal(self, event, stream: int) -> None:
        pass  # nothing waits for it: no daemon copies

    def enqueue_wait(self, event, stream: int) -> None:
        pass

    def unregister_device(self, pointer: int, *, wait: bool = True) -> Union[Completion, int]:
        return self._answer(Tier.NONE, wait)

    def release_device_mappings(self, timeout_ms: Optional[float] = None) -> None:
        pass

    def graphs_destroyed(self) -> None:
        pass  # nothing was captured

    def begin_step(self, step: int, *, stream: Optional[int] = None, wait: bool = True,
                   timeout_ms: Optional[float] = None) -> Union[Completion, int]:
        for ext in list(self._extensions.values()):
            hook = getattr(ext, "begin_step", None)
            if hook is not None:
                hook(int(step))
        return self._answer(Tier.NONE, wait)

    def wait(self, op: int, timeout_ms: Optional[float] = None) -> Completion:
        with self._lock:
            answer = self._answers.pop(int(op), None)
        if answer is None:
            raise error_for(NOT_FOUND, f"stashd: operation {int(op)} is unknown or was already "
                                       "answered")
        return answer

    def poll(self, op: int) -> Optional[Completion]:
        return self.wait(op)

    def step_flags(self) -> StepFlags:
        unavailable = any(getattr(ext, "step_unavailable", False)
                          for ext in self._extensions.values())
        return StepFlags(False, False, unavailable)

    def stats(self) -> Stats:
        return Stats(**{name: 0 for name in _lib.STATS_FIELDS})

    def session(self) -> SessionInfo:
        return SessionInfo("", 0, 0, 0)  # no daemon, no session

    @property
    def session_id(self) -> str:
        return ""

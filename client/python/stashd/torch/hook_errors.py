"""Errors raised inside the autograd hooks, kept reachable for the trainer.

PyTorch calls saved-tensor hooks from C++ and re-raises whatever they raise as a new
`RuntimeError("ValueError: ...")`, so `except stashd.StashError` never matches. stashd.torch
records the original exception before it leaves a hook:

  * in forward, `stash_saved_tensors.__exit__` replaces PyTorch's RuntimeError with the original
    (chained: `raise original from runtime_error`), so `except stashd.StashError` and
    `except ValueError` work around the `with` block;
  * in backward, `with stash_torch.unwrap_errors(): loss.backward()` does the same;
  * anywhere, `stash_torch.last_error()` returns the last original exception.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

_lock = threading.Lock()
_last: Optional[BaseException] = None
_serial = 0  # counts recorded errors, so a scope knows whether one happened inside it


def record(error: BaseException) -> None:
    """Called by the hooks before an exception leaves them (any thread: autograd's too)."""
    global _last, _serial
    with _lock:
        _last = error
        _serial += 1


def last_error() -> Optional[BaseException]:
    """The last exception a stashd.torch hook raised in this process (None: none yet). PyTorch
    hands the trainer a RuntimeError whose text starts with this exception's class name."""
    with _lock:
        return _last


def serial() -> int:
    with _lock:
        return _serial


def original(wrapped: BaseException, since: int) -> Optional[BaseException]:
    """The hook's own exception behind `wrapped` (PyTorch's RuntimeError), when a hook raised
    after serial() was `since` and `wrapped` carries its text; else None."""
    with _lock:
        error, count = _last, _serial
    if error is None or count == since or error is wrapped:
        return None
    if not isinstance(wrapped, RuntimeError) or str(error) not in str(wrapped):
        return None
    return error


@contextlib.contextmanager
def unwrap_errors():
    """Re-raises the original exception of a stashd.torch hook instead of PyTorch's
    RuntimeError wrapper, chained to it. Wrap backward: `with unwrap_errors(): loss.backward()`.
    """
    since = serial()
    try:
        yield
    except RuntimeError as wrapped:
        error = original(wrapped, since)
        if error is None:
            raise
        raise error from wrapped

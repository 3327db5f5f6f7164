"""Exceptions: every failing library call becomes a StashError with the daemon's code."""

from __future__ import annotations

# google.rpc.Code / stash::StatusCode, the numbers the C ABI returns.
CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

NOT_FOUND = 5
DEADLINE_EXCEEDED = 4
UNAVAILABLE = 14


class StashError(RuntimeError):
    """A call the library or the daemon refused.

    code: the status code (int, google.rpc.Code numbering); code_name: its name, e.g.
    "NOT_FOUND"; message: what the library or daemon said, without the code prefix; op: for a
    call that queued an operation and then waited for it (stash or reload with wait=True), the
    operation's id (a stash's ticket). Only after DeadlineExceeded is it still in flight (wait()
    on it again); after any other error its answer was this error. None for other calls.
    """

    def __init__(self, code: int, message: str):
        self.op = None
        self.code = int(code)
        self.code_name = CODE_NAMES.get(self.code, f"CODE_{self.code}")
        prefix = self.code_name + ": "
        self.message = message[len(prefix):] if message.startswith(prefix) else message
        super().__init__(f"{self.code_name}: {self.message}")


class Unavailable(StashError):
    """The daemon is not there or went away (code 14): start it, or retry later."""


class DeadlineExceeded(StashError, TimeoutError):
    """A wait ran past its timeout (code 4); the operation may still complete."""


def error_for(code: int, message: str) -> StashError:
    """The most specific exception class for a status code."""
    if code == UNAVAILABLE:
        return Unavailable(code, message)
    if code == DEADLINE_EXCEEDED:
        return DeadlineExceeded(code, message)
    return StashError(code, message)

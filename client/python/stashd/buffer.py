"""Buffer: memory the daemon can read and write (a sealed memfd, handed to it by descriptor)."""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

from stashd import _lib
from stashd.errors import error_for


class Buffer:
    """A zero-filled, page-aligned region of shared memory the daemon maps on first use.

    Stash sources, reload destinations, count cells (int64) and event counters all live in
    Buffers. The daemon opens a Buffer once per session and keeps its mapping until the session
    ends, so reuse Buffers rather than allocating one per request.

    Not thread-safe to free while another thread uses it. Views (`view()`, `tensor()`) keep
    the Buffer object alive, but `free()` unmaps the memory at once: drop the views first.
    Exception: a Buffer whose event counters a CUDA stream raised or waited on
    (`Client.enqueue_signal` / `enqueue_wait`) stays mapped after `free()` until the process
    exits, because a stream may still wait on it (freeing it under the wait would fault the
    CUDA context).
    """

    def __init__(self, nbytes: int):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"stashd.Buffer: size must be > 0 bytes, got {nbytes}")
        lib = _lib.lib()
        handle = _lib.c_buffer_p()
        code = lib.stash_buffer_alloc(nbytes, ctypes.byref(handle))
        if code != 0:
            raise error_for(code, _lib.last_error())
        self._lib = lib
        self._handle: Optional[int] = handle.value
        self._address: int = lib.stash_buffer_data(handle)
        self._size: int = lib.stash_buffer_size(handle)

    # --- Properties -------------------------------------------------------------------------

    @property
    def handle(self) -> int:
        """The opaque stash_buffer_t* the C ABI takes. ValueError once freed."""
        if self._handle is None:
            raise ValueError("stashd.Buffer: used after free()")
        return self._handle

    @property
    def address(self) -> int:
        """The first byte's address in this process."""
        self.handle  # raises when freed
        return self._address

    @property
    def size(self) -> int:
        """Bytes the buffer holds (at least what was asked for)."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        state = "freed" if self.closed else f"at 0x{self._address:x}"
        return f"<stashd.Buffer {self._size} bytes {state}>"

    # --- Access -----------------------------------------------------------------------------

    def _array(self, offset: int, nbytes: Optional[int]):
        offset, nbytes = self._check_range(offset, nbytes)
        array = (ctypes.c_ubyte * nbytes).from_address(self.address + offset)
        array._stashd_owner = self  # the view keeps this Buffer (and its mapping) alive
        return array

    def _check_range(self, offset: int, nbytes: Optional[int]):
        offset = int(offset)
        if nbytes is None:
            nbytes = self._size - offset
        nbytes = int(nbytes)
        if offset < 0 or nbytes < 0 or offset + nbytes > self._size:
            raise ValueError(f"stashd.Buffer: range [{offset}, {offset + nbytes}) is outside "
                             f"the buffer's {self._size} bytes")
        return offset, nbytes

    def view(self, offset: int = 0, nbytes: Optional[int] = None) -> memoryview:
        """A writable byte memoryview of [offset, offset + nbytes) (default: to the end)."""
        return memoryview(self._array(offset, nbytes)).cast("B")

    def read(self, offset: int = 0, nbytes: Optional[int] = None) -> bytes:
        """A copy of [offset, offset + nbytes)."""
        offset, nbytes = self._check_range(offset, nbytes)
        return ctypes.string_at(self.address + offset, nbytes)

    def write(self, data: bytes, offset: int = 0) -> None:
        """Copies `data` (any bytes-like object) to offset."""
        src = memoryview(data).cast("B")
        offset, nbytes = self._check_range(offset, src.nbytes)
        if nbytes:
            self.view(offset, nbytes)[:] = src

    def read_int64(self, offset: int = 0) -> int:
        offset, _ = self._check_range(offset, 8)
        return ctypes.c_int64.from_address(self.address + offset).value

    def write_int64(self, value: int, offset: int = 0) -> None:
        """Stores an int64 count cell, as the daemon reads it (little-endian, native)."""
        offset, _ = self._check_range(offset, 8)
        ctypes.c_int64.from_address(self.address + offset).value = int(value)

    # --- Events (8-byte counters) -----------------------------------------------------------

    def signal(self, offset: int, value: int) -> None:
        """Raises the event counter at offset (8-byte aligned) to value; wakes every waiter."""
        self._check_range(offset, 8)
        self._lib.stash_event_signal(self.handle, offset, value)

    def wait_event(self, offset: int, value: int, timeout_ms: Optional[int] = None) -> bool:
        """Blocks until the counter at offset reaches value (True) or timeout_ms passes (False;
        None = forever)."""
        self._check_range(offset, 8)
        return bool(self._lib.stash_event_wait(self.handle, offset, value,
                                               -1 if timeout_ms is None else int(timeout_ms)))

    # --- Lifetime ---------------------------------------------------------------------------

    def free(self) -> None:
        """Unmaps and frees the memory here; idempotent. A daemon that mapped it keeps its own
        mapping until the session ends."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.stash_buffer_free(handle)

    close = free

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

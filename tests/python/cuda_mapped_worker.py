"""A rank of cuda_mapped_test: mapped mode on the cuda backend through the Python client, on the
CUDA driver stand-in (tests/cuda_standin; the test starts this process with the stand-in first on
LD_LIBRARY_PATH as libcuda.so.1). It drives the driver through ctypes, as PyTorch would, and
prints one JSON object with what it saw; cuda_mapped_test.py asserts on it.

usage: cuda_mapped_worker.py SOCKET
"""

from __future__ import annotations

import ctypes
import json
import sys

import stashd

ROW = 4096
CHUNK = 2 << 20  # the daemon's --chunk-bytes, the lease below


class Driver:
    """The few driver calls a test needs, checked."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        self.cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.check(self.cu.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self.check(self.cu.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self.check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device),
                   "cuDevicePrimaryCtxRetain")
        self.check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = ctypes.c_void_p()
        self.check(self.cu.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")

    @staticmethod
    def check(result: int, what: str) -> None:
        if result != 0:
            raise SystemExit(f"{what} failed: CUresult {result}")

    def put(self, data: bytes) -> int:
        """Device memory holding data, landed before anything enqueued later runs."""
        pointer = ctypes.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(ctypes.byref(pointer), len(data)), "cuMemAlloc_v2")
        self.write(pointer.value, data)
        return pointer.value

    def write(self, pointer: int, data: bytes) -> None:
        self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self.check(self.cu.cuMemcpyHtoD_v2(pointer, data, len(data)), "cuMemcpyHtoD_v2")
        self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def sync(self) -> None:
        self.check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def get(self, pointer: int, size: int) -> bytes:
        self.sync()
        out = ctypes.create_string_buffer(size)
        self.check(self.cu.cuMemcpyDtoH_v2(out, pointer, size), "cuMemcpyDtoH_v2")
        return out.raw


def pattern(size: int, seed: int) -> bytes:
    return bytes((seed + i * 7 + i // ROW) & 0xFF for i in range(size))


def main() -> int:
    socket = sys.argv[1]
    d = Driver()
    stream = d.stream.value
    seen = {}
    client = stashd.connect(socket, backend="cuda", mode="mapped", lease={"device": CHUNK},
                            device=0)
    seen["on_stream"] = client.on_stream
    client.begin_step(1, stream=stream)

    # A round trip that does not need the source after the stash: it is overwritten at once.
    rows, max_rows = 10, 16
    data = pattern(max_rows * ROW, 5)
    src = d.put(data)
    done = client.stash_device(src, row_bytes=ROW, max_rows=max_rows, count=rows,
                               stream=stream, keep_source=False)
    seen["stash_tier"] = done.tier.name
    d.sync()
    d.write(src, b"\xab" * len(data))
    dst = d.put(b"\x11" * len(data))
    client.reload_device(done.ticket, dst, zero_tail=True, stream=stream)
    back = d.get(dst, len(data))
    seen["round_trip"] = back == data[:rows * ROW] + bytes((max_rows - rows) * ROW)
    seen["flags_after_fit"] = client.step_flags().overflow

    # Two chunks' worth with the source not kept: the reload leaves the destination and the step
    # is flagged, before it ends.
    big = 2 * CHUNK // ROW
    big_src = d.put(pattern(big * ROW, 9))
    lost = client.stash_device(big_src, row_bytes=ROW, max_rows=big, count=big, stream=stream,
                               keep_source=False)
    big_dst = d.put(b"\x22" * (big * ROW))
    client.reload_device(lost.ticket, big_dst, stream=stream)
    seen["overflow_left_destination"] = d.get(big_dst, big * ROW) == b"\x22" * (big * ROW)
    seen["flags_after_overflow"] = client.step_flags().overflow
    client.begin_step(2, stream=stream)
    d.sync()
    seen["flags_next_step"] = client.step_flags().overflow

    # A release on the stream, then the ticket is gone; events on a stream are refused.
    kept = client.stash_device(src, row_bytes=ROW, max_rows=max_rows, count=rows, stream=stream)
    client.release(kept.ticket, stream=stream)
    try:
        client.reload_device(kept.ticket, dst, stream=stream)
        seen["reload_after_release"] = "OK"
    except stashd.StashError as e:
        seen["reload_after_release"] = e.code_name
    try:
        client.reload_device(kept.ticket, dst, stream=stream, done=(None, 0, 1))
        seen["events_on_a_stream"] = "accepted"
    except ValueError as e:
        seen["events_on_a_stream"] = str(e)
    d.sync()
    client.graphs_destroyed()  # nothing was captured: a no-op that must be accepted
    seen["graphs_destroyed"] = True
    client.close()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())

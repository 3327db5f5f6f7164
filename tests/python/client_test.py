"""stashd (client/python/stashd): the ctypes client against a real daemon."""

from __future__ import annotations

import ctypes
import os

import pytest

import stashd
from stashd import _lib

ROW = 1024


def fill(buffer: stashd.Buffer, rows: int, seed: int) -> bytes:
    data = bytes((seed + i * 7 + i // ROW) % 251 for i in range(rows * ROW))
    buffer.write(data)
    return data


def test_connect_to_missing_socket_raises_unavailable_naming_it(tmp_path):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(stashd.Unavailable) as info:
        stashd.connect(path, connect_timeout_ms=200)
    assert info.value.code == 14
    assert info.value.code_name == "UNAVAILABLE"
    assert path in str(info.value)


def test_reload_of_unknown_ticket_raises_not_found(client):
    with stashd.Buffer(ROW * 4) as dest:
        with pytest.raises(stashd.StashError) as info:
            client.reload(0x1234, dest)
    assert info.value.code == 5
    assert info.value.code_name == "NOT_FOUND"
    assert not isinstance(info.value, stashd.Unavailable)
    assert "ticket" in info.value.message


def test_stash_and_reload_round_trip_the_valid_prefix(client):
    src, dest = stashd.Buffer(ROW * 64), stashd.Buffer(ROW * 64)
    data = fill(src, 64, seed=3)
    dest.write(b"\xff" * (ROW * 64))
    done = client.stash(src, row_bytes=ROW, max_rows=64, count=40, name="rt")
    assert done.tier == stashd.Tier.DEVICE and not done.overflowed
    assert done.rows == 40 and done.bytes == 40 * ROW
    back = client.reload(done.ticket, dest, zero_tail=True)
    assert back.rows == 40
    assert dest.read(0, 40 * ROW) == data[: 40 * ROW]
    assert dest.read(40 * ROW) == bytes(24 * ROW)  # zero_tail
    with pytest.raises(stashd.StashError) as info:
        client.reload(done.ticket, dest)  # a ticket is spent by its reload
    assert info.value.code_name == "NOT_FOUND"


def test_count_cell_is_read_at_copy_time_and_divided(client):
    # An MXFP8 columnwise scale_inv: one row per 32 tokens, count from shared memory.
    src, dest, cell = stashd.Buffer(ROW * 8), stashd.Buffer(ROW * 8), stashd.Buffer(8)
    data = fill(src, 8, seed=9)
    cell.write_int64(96)  # tokens -> 3 rows
    ticket = client.stash(src, row_bytes=ROW, max_rows=8, count=(cell, 0), divisor=32,
                          wait=False)
    done = client.wait(ticket)
    assert done.ticket == ticket and done.rows == 3
    client.reload(ticket, dest)
    assert dest.read(0, 3 * ROW) == data[: 3 * ROW]


def test_stats_count_stashes_reloads_releases_and_pages_return(client):
    src = stashd.Buffer(ROW * 256)
    fill(src, 256, seed=1)
    a = client.stash(src, row_bytes=ROW, max_rows=256, count=256)
    b = client.stash(src, row_bytes=ROW, max_rows=256, count=100)
    s = client.stats()
    assert s.stashes == 2 and s.stashes_live == 2
    assert s.pool_pages_used == a.pages + b.pages == 4 + 2  # 64 KiB pages
    assert s.bytes_stashed == 356 * ROW
    client.reload(a.ticket, src)
    released = client.release(b.ticket)
    assert released.pages == 2
    s = client.stats()
    assert (s.reloads, s.releases, s.stashes_live) == (1, 1, 0)
    assert s.pool_pages_used == 0 and s.pages_used == 0
    assert s.pool_pages_high_water >= 6


def test_overflow_takes_nothing_and_sets_the_step_flag(start_daemon):
    d = start_daemon("--pool-bytes=64KiB", "--host-tier-bytes=0", "--page-bytes=64KiB")
    with d.connect() as c, stashd.Buffer(ROW * 128) as src:
        assert c.begin_step(1).step_overflow is False
        first = c.stash(src, row_bytes=ROW, max_rows=64, count=64)  # one page: fits
        assert first.tier == stashd.Tier.DEVICE
        second = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        assert second.overflowed and second.tier == stashd.Tier.OVERFLOW
        beyond = c.stash(src, row_bytes=ROW, max_rows=64, count=65)  # count > max_rows
        assert beyond.overflowed
        assert c.step_flags() == stashd.StepFlags(overflow=True, spilled=False)
        assert c.stats().overflows == 2
        with pytest.raises(stashd.StashError):
            c.reload(second.ticket, src)  # an overflowed stash has no pages to give back
        nxt = c.begin_step(2)
        assert nxt.step_overflow is True
        assert c.step_flags().overflow is False
        c.release(first.ticket)


def test_full_pool_spills_to_the_host_tier(start_daemon):
    d = start_daemon("--pool-bytes=64KiB", "--host-tier-bytes=1MiB", "--page-bytes=64KiB")
    with d.connect() as c, stashd.Buffer(ROW * 64) as src, stashd.Buffer(ROW * 64) as dest:
        data = fill(src, 64, seed=5)
        a = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        b = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        assert (a.tier, b.tier) == (stashd.Tier.DEVICE, stashd.Tier.HOST)
        assert c.step_flags().spilled
        assert c.reload(b.ticket, dest).tier == stashd.Tier.HOST
        assert dest.read() == data
        c.release(a.ticket)
        s = c.stats()
        assert s.spills == 1 and s.pages_used == 0


def test_no_host_spill_option_overflows_instead(start_daemon):
    d = start_daemon("--pool-bytes=64KiB", "--host-tier-bytes=1MiB", "--page-bytes=64KiB")
    with d.connect(allow_host_spill=False) as c, stashd.Buffer(ROW * 64) as src:
        a = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        b = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        assert a.tier == stashd.Tier.DEVICE and b.overflowed
        assert c.step_flags() == stashd.StepFlags(overflow=True, spilled=False)


def test_invalid_request_is_an_error_and_the_session_goes_on(client):
    with stashd.Buffer(ROW) as src:
        with pytest.raises(stashd.StashError) as info:
            client.stash(src, row_bytes=ROW, max_rows=2, count=1)  # past the buffer's end
        assert info.value.code_name == "INVALID_ARGUMENT"
        assert client.stash(src, row_bytes=ROW, max_rows=1, count=1).rows == 1


def test_poll_returns_none_until_answered_then_the_completion(client):
    with stashd.Buffer(ROW * 4) as src, stashd.Buffer(8) as ev:
        ticket = client.stash(src, row_bytes=ROW, max_rows=4, count=4, ready=(ev, 0, 1),
                              wait=False)
        assert client.poll(ticket) is None  # the daemon waits for the ready event
        with pytest.raises(stashd.DeadlineExceeded):
            client.wait(ticket, timeout_ms=20)
        ev.signal(0, 1)
        assert client.wait(ticket).rows == 4


def test_a_waiting_stash_that_times_out_names_the_operation_still_in_flight(client):
    # wait=True is one library call (stash_stash_wait): its timeout error carries the ticket.
    with stashd.Buffer(ROW * 4) as src, stashd.Buffer(ROW * 4) as dest, \
            stashd.Buffer(8) as ev:
        data = fill(src, 4, seed=5)
        with pytest.raises(stashd.DeadlineExceeded) as info:
            client.stash(src, row_bytes=ROW, max_rows=4, count=4, ready=(ev, 0, 1),
                         timeout_ms=20)
        ticket = info.value.op
        assert ticket
        ev.signal(0, 1)
        done = client.wait(ticket)
        assert done.ticket == ticket and done.rows == 4
        back = client.reload(ticket, dest, timeout_ms=10_000)
        assert back.rows == 4 and dest.read(0, 4 * ROW) == data
        with pytest.raises(stashd.StashError) as spent:
            client.reload(ticket, dest)
        assert spent.value.code_name == "NOT_FOUND" and spent.value.op
        with pytest.raises(stashd.StashError) as bad:
            client.stash(src, row_bytes=ROW, max_rows=8, count=1)  # past the buffer's end
        assert bad.value.code_name == "INVALID_ARGUMENT" and bad.value.op is None


def test_closed_client_raises_unavailable(daemon):
    c = daemon.connect()
    c.close()
    c.close()  # idempotent
    with pytest.raises(stashd.Unavailable):
        c.stats()


def test_buffer_views_and_bounds():
    with stashd.Buffer(100) as b:
        assert b.size >= 100 and b.read(0, 100) == bytes(100)  # zero-filled
        b.write(b"abc", offset=10)
        assert bytes(b.view(10, 3)) == b"abc"
        b.write_int64(-7, offset=16)
        assert b.read_int64(16) == -7
        with pytest.raises(ValueError):
            b.read(b.size - 1, 2)
    assert b.closed
    with pytest.raises(ValueError):
        b.address
    with pytest.raises(ValueError):
        stashd.Buffer(0)


def test_missing_library_error_lists_every_path_tried(monkeypatch, tmp_path):
    monkeypatch.delenv("STASHD_CLIENT_LIB", raising=False)
    monkeypatch.setenv("STASHD_BIN_DIR", str(tmp_path / "bin"))
    monkeypatch.setattr(_lib, "_PACKAGE_DIR", str(tmp_path / "pkg"))
    monkeypatch.setattr(_lib, "_REPO_ROOT", str(tmp_path / "repo"))
    monkeypatch.setattr(_lib.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(stashd.LibraryNotFound) as info:
        _lib._load()
    message = str(info.value)
    for path in (tmp_path / "pkg" / "libstash_client.so",
                 tmp_path / "bin" / "client" / "libstash_client.so",
                 tmp_path / "repo" / "build" / "release" / "client" / "libstash_client.so"):
        assert str(path) in message
    assert "STASHD_CLIENT_LIB" in message


def test_explicit_library_path_that_is_wrong_is_an_error(monkeypatch, tmp_path):
    bad = str(tmp_path / "nope" / "libstash_client.so")
    monkeypatch.setenv("STASHD_CLIENT_LIB", bad)
    with pytest.raises(stashd.LibraryNotFound, match="STASHD_CLIENT_LIB"):
        _lib._load()


def test_version_matches_the_library():
    assert stashd.version().count(".") == 2
    assert os.path.basename(_lib.lib()._name).startswith("libstash_client.so")


def _header_structs(text: str):
    """{struct name: [(C type, field name)]} of the typedef structs in c_api.h."""
    import re

    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\}", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            ctype, names = re.match(r"((?:const )?\w+\*?)\s+(.*)", decl).groups()
            fields += [(ctype, n.strip().lstrip("*")) for n in names.split(",")]
        out[name] = fields
    return out, set(re.findall(r"STASH_EXPORT [^;]*?\b(stash_\w+)\(", text))


def test_ctypes_declarations_match_the_c_api_header():
    # The ABI is described twice (c_api.h and stashd/_lib.py): catch drift here, not in a crash.
    import ctypes

    header = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "include", "stash",
                          "c_api.h")
    with open(header) as f:
        structs, functions = _header_structs(f.read())
    c_types = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32,
               "int32_t": ctypes.c_int32, "stash_buffer_t*": ctypes.c_void_p,
               "const char*": ctypes.c_char_p, "const void*": ctypes.c_void_p}
    for c_name, py in (("stash_stash_args", _lib.StashArgs),
                       ("stash_completion", _lib.CompletionStruct),
                       ("stash_stats", _lib.StatsStruct)):
        want = [(name, c_types[ctype]) for ctype, name in structs[c_name]]
        assert [(name, t) for name, t in py._fields_] == want, c_name
    assert functions == set(_lib._PROTOTYPES)


# --- The cuda backend's API, where it can be checked without a GPU ------------------------------

def test_connect_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="'host' or 'cuda'"):
        stashd.connect(backend="gpu")


def test_cuda_backend_without_a_driver_says_what_is_missing(tmp_path):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(stashd.StashError) as info:
        stashd.connect(path, backend="cuda", connect_timeout_ms=200)
    if os.path.exists("/dev/nvidiactl"):
        assert info.value.code_name == "UNAVAILABLE"  # a GPU node: only the daemon is missing
    else:
        assert info.value.code_name == "FAILED_PRECONDITION"
        assert "NVIDIA driver" in info.value.message or "STASH_ENABLE_CUDA" in info.value.message


def test_device_calls_on_the_host_backend_name_the_fix(client):
    assert client.backend == "host"
    with stashd.Buffer(4096) as events:
        with pytest.raises(stashd.StashError) as info:
            client.stash_device(0x7000_0000_0000, row_bytes=ROW, max_rows=4, count=4)
        assert info.value.code_name == "INVALID_ARGUMENT"
        assert "Backend::kCuda" in info.value.message
        with pytest.raises(ValueError, match="exactly one"):
            client.stash_device(0x7000_0000_0000, row_bytes=ROW, max_rows=4)
        with pytest.raises(stashd.StashError) as info:
            client.reload_device(1, 0x7000_0000_0000)
        assert info.value.code_name == "INVALID_ARGUMENT"
        with pytest.raises(stashd.StashError) as info:
            client.enqueue_signal((events, 0, 1), 0)
        assert info.value.code_name == "FAILED_PRECONDITION"
        assert "SignalEvent" in info.value.message
        with pytest.raises(stashd.StashError) as info:
            client.enqueue_wait((events, 0, 1), 0)
        assert info.value.code_name == "FAILED_PRECONDITION"
    client.release_device_mappings(timeout_ms=1000)  # nothing to do here, and no error
    # The session is unharmed.
    src = stashd.Buffer(ROW * 4)
    fill(src, 4, seed=1)
    assert client.stash(src, row_bytes=ROW, max_rows=4, count=4).tier == stashd.Tier.DEVICE


# --- mapped mode (connect(mode="mapped")) --------------------------------------------------

def test_mapped_mode_with_a_fixed_lease_spills_to_its_host_chunks(start_daemon):
    d = start_daemon("--pool-bytes=1MiB", "--host-tier-bytes=1MiB", "--page-bytes=64KiB",
                     "--max-lease-bytes=4MiB")
    lease = {"device": 64 << 10, "host": 128 << 10}
    with d.connect(mode="mapped", lease=lease) as c, stashd.Buffer(ROW * 64) as src, \
            stashd.Buffer(ROW * 64) as dest:
        assert c.mode == "mapped"
        data = fill(src, 64, seed=9)
        a = c.stash(src, row_bytes=ROW, max_rows=64, count=64)  # one page: the device lease
        b = c.stash(src, row_bytes=ROW, max_rows=64, count=64)
        assert (a.tier, b.tier) == (stashd.Tier.DEVICE, stashd.Tier.HOST)
        assert c.step_flags().spilled
        assert c.reload(b.ticket, dest).tier == stashd.Tier.HOST
        assert dest.read() == data
        c.release(a.ticket)
        assert c.stats().pages_live == 0


def test_a_mapped_sessions_tags_reach_stashctl_sessions_json(start_daemon):
    """Issue 21: the layer, microbatch and name a Python rank gives its mapped stashes are what
    `stashctl sessions --json` lists under `live` (never `"live": []` beside live stashes)."""
    import json
    import subprocess

    from conftest import bin_dir

    d = start_daemon("--pool-bytes=1MiB", "--host-tier-bytes=0", "--page-bytes=64KiB",
                     "--max-lease-bytes=1MiB")
    with d.connect(mode="mapped", lease={"device": 512 << 10}) as c, \
            stashd.Buffer(ROW * 64) as src:
        fill(src, 64, seed=3)
        c.stash(src, row_bytes=ROW, max_rows=64, count=64, layer=5, microbatch=2, name="router")
        c.stash(src, row_bytes=ROW, max_rows=64, count=32, layer=5, microbatch=2, name="router")
        run = subprocess.run([os.path.join(bin_dir(), "client", "stashctl", "stashctl"),
                              f"--socket={d.socket}", "sessions", "--json"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        (session,) = json.loads(run.stdout)["sessions"]
        assert session["mode"] == "MODE_MAPPED"
        assert session["stashes_live"] == "2"
        assert session["live"] == [{"layer": 5, "microbatch": 2, "name": "router", "stashes": "2",
                                    "bytes": str(96 * ROW), "pages": "2"}], session
        assert session["live_untagged"] == "0"


def test_mapped_mode_arguments_are_checked_before_connecting():
    with pytest.raises(ValueError, match="mode must be"):
        stashd.connect(mode="copy")
    with pytest.raises(ValueError, match="lease must be 'auto'"):
        stashd.connect(mode="mapped", lease="big")
    with pytest.raises(ValueError, match="lease tiers are device, peer, host"):
        stashd.connect(mode="mapped", lease={"gpu": 1})
    # Negative (or not whole) bytes are refused with the value, before connecting.
    with pytest.raises(ValueError, match=r"lease\['device'\] is -5: give a whole number"):
        stashd.connect(mode="mapped", lease={"device": -5})
    with pytest.raises(ValueError, match=r"lease\['host'\] is 1.5"):
        stashd.connect(mode="mapped", lease={"host": 1.5})


def test_mapped_mode_on_the_cuda_backend_without_a_driver_says_what_is_missing(tmp_path):
    """Mapped mode on the cuda backend opens the GPU twin; on a machine without the NVIDIA
    driver it is refused before connecting, naming the driver and the socket."""
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a CUDA driver: the refusal needs one without")
    except OSError:
        pass
    with pytest.raises(stashd.StashError) as info:
        stashd.connect(str(tmp_path / "none.sock"), mode="mapped", backend="cuda",
                       connect_timeout_ms=100)
    assert info.value.code_name == "FAILED_PRECONDITION", str(info.value)
    assert "NVIDIA driver" in str(info.value), str(info.value)
    assert "none.sock" in str(info.value), str(info.value)


def test_stream_calls_outside_mapped_mode_on_cuda_are_refused_saying_which_mode(client):
    """A stream (even 0, the legacy default stream) asks for the stream-ordered calls of mapped
    mode on the cuda backend; elsewhere they would run unordered with the caller's kernels."""
    assert not client.on_stream
    with pytest.raises(stashd.StashError) as info:
        client.stash_device(0x1000, row_bytes=64, max_rows=1, count=1, stream=0)
    assert info.value.code_name == "FAILED_PRECONDITION", str(info.value)
    assert "mapped mode on the cuda backend" in str(info.value)
    for call in (lambda: client.reload_device(1, 0x1000, stream=0),
                 lambda: client.release(1, stream=0),
                 lambda: client.begin_step(1, stream=0)):
        with pytest.raises(stashd.StashError, match="_on_stream"):
            call()
    with pytest.raises(ValueError, match="keep_source=False is for mapped mode"):
        client.stash_device(0x1000, row_bytes=64, max_rows=1, count=1, keep_source=False)
    with pytest.raises(stashd.StashError, match="CUDA graphs") as info:
        client.graphs_destroyed()
    assert info.value.code_name == "FAILED_PRECONDITION", str(info.value)

"""stashd --log-format=json: every line one object, and an event's session, rank, pid, layer,
microbatch and name are fields of it, not only words in the message."""

from __future__ import annotations

import json
import os
import subprocess

import stashd
from conftest import daemon_binary


def _objects(log: str):
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines, "the daemon logged nothing"
    return [json.loads(line) for line in lines]  # raises on a line that is not JSON


def test_an_overflow_line_carries_its_tags_as_fields(start_daemon):
    daemon = start_daemon("--pool-bytes=1MiB", "--host-tier-bytes=0", "--page-bytes=64KiB",
                          "--log-format=json")
    with daemon.connect(rank=3, label="json-logs") as client:
        src = stashd.Buffer(4 << 20)
        done = client.stash(src, row_bytes=1 << 20, max_rows=4, count=4, layer=5, microbatch=2,
                            name="experts")
        assert done.overflowed
    assert daemon.stop() == 0  # the session's end is logged before the daemon exits
    with open(daemon.log_path, encoding="utf-8") as f:
        objects = _objects(f.read())
    for o in objects:
        assert {"time", "level", "logger", "message"} <= set(o), o
    overflows = [o for o in objects if o["message"].startswith("overflow:")]
    assert len(overflows) == 1, objects
    o = overflows[0]
    assert o["rank"] == 3 and o["pid"] == os.getpid(), o
    assert o["layer"] == 5 and o["microbatch"] == 2 and o["name"] == "experts", o
    assert o["label"] == "json-logs" and len(o["session"]) == 8, o
    ended = [o for o in objects if " ended: " in o["message"]]
    assert ended and ended[0]["session"] == o["session"] and ended[0]["rank"] == 3, objects


def test_a_fatal_start_error_is_json_too(tmp_path):
    for args, env in ((["--log-format=json", "--pool-bytes=lots"], {}),
                      (["--bogus"], {"STASHD_LOG_FORMAT": "json"})):
        run = subprocess.run([daemon_binary(), f"--socket={tmp_path / 's.sock'}", *args],
                             capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", **env})
        assert run.returncode != 0
        (line,) = run.stderr.strip().splitlines()
        o = json.loads(line)
        assert o["level"] == "critical" and o["logger"] == "stashd.main", o
        assert ("lots" if "--pool-bytes=lots" in args else "--bogus") in o["message"], o

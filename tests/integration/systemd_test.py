"""stashd under systemd's Type=notify: READY=1 once it serves, STOPPING=1 on SIGTERM.

Stands in for systemd: a Unix datagram socket in $NOTIFY_SOCKET, as systemd gives a
Type=notify service. Every wait is bounded.

Run: ctest -R integration.systemd, or
     STASHD_BIN_DIR=build/release /usr/bin/python3 -m pytest -q tests/integration/systemd_test.py
"""

import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

STASHD = Path(os.environ.get("STASHD_BIN_DIR", "")) / "daemon" / "stashd"
STASHCTL = Path(os.environ.get("STASHD_BIN_DIR", "")) / "client" / "stashctl" / "stashctl"


def test_stashd_notifies_ready_once_serving_and_stopping_on_sigterm():
    if not STASHD.is_file():
        pytest.fail(f"{STASHD} is not built (set STASHD_BIN_DIR to a build tree)")
    with tempfile.TemporaryDirectory(prefix="stashd-notify-") as tmp:
        notify_path = os.path.join(tmp, "notify")
        sock = os.path.join(tmp, "stashd.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(notify_path)
        listener.settimeout(30)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        proc = subprocess.Popen(
            [str(STASHD), f"--socket={sock}", "--backend=host", "--pool-bytes=16MiB",
             "--host-tier-bytes=16MiB", "--log-level=warn"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            ready = listener.recv(4096).decode()
            assert "READY=1" in ready.splitlines(), ready
            assert f"STATUS=serving on {sock}" in ready.splitlines(), ready
            # READY means serving: the socket answers now, without retrying.
            health = subprocess.run([str(STASHCTL), "health", f"--socket={sock}"],
                                    capture_output=True, text=True, timeout=30)
            assert health.stdout == "SERVING\n", health.stdout + health.stderr
            proc.send_signal(signal.SIGTERM)
            stopping = listener.recv(4096).decode()
            assert "STOPPING=1" in stopping.splitlines(), stopping
            assert proc.wait(timeout=30) == 0, proc.stdout.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            listener.close()

"""Fixtures: a real stashd per test, on a socket in the test's temp dir.

STASHD_BIN_DIR names the build tree (ctest sets it): the daemon is $STASHD_DAEMON, else
$STASHD_BIN_DIR/daemon/stashd, and the client library $STASHD_CLIENT_LIB, else
$STASHD_BIN_DIR/client/libstash_client.so (the stashd package looks in both places). Run by
hand without them, the newest build tree under build/ is used.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import pytest

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
PACKAGE_DIR = os.path.join(REPO_ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import stashd  # noqa: E402

# Bounds on waits that a healthy daemon meets in milliseconds; never used as synchronisation.
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0

DEFAULT_FLAGS = ("--pool-bytes=64MiB", "--host-tier-bytes=64MiB", "--page-bytes=64KiB")


def daemon_binary() -> str:
    explicit = os.environ.get("STASHD_DAEMON")
    return explicit or os.path.join(bin_dir(), "daemon", "stashd")


def bin_dir() -> str:
    d = os.environ.get("STASHD_BIN_DIR")
    if d:
        return d
    # Run by hand: the newest build tree that has a daemon.
    found = []
    build = os.path.join(REPO_ROOT, "build")
    if os.path.isdir(build):
        for name in os.listdir(build):
            daemon = os.path.join(build, name, "daemon", "stashd")
            if os.access(daemon, os.X_OK):
                found.append((os.path.getmtime(daemon), os.path.join(build, name)))
    if not found:
        pytest.fail("no stashd binary: set STASHD_BIN_DIR to a build tree (ctest does) or build "
                    "the `stashd` target into build/<preset>")
    return max(found)[1]


def socket_accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A stashd child process; stop() SIGTERMs it and returns its exit code."""

    def __init__(self, directory: str, flags: List[str]):
        self.socket = os.path.join(directory, "stashd.sock")
        self.log_path = os.path.join(directory, "stashd.log")
        self.binary = daemon_binary()
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen([self.binary, f"--socket={self.socket}", *flags],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not socket_accepts(self.socket):
            if self.process.poll() is not None:
                pytest.fail(f"stashd exited with {self.process.returncode} before serving:\n"
                            f"{self.log()}")
            if time.monotonic() > deadline:
                self.process.kill()
                pytest.fail(f"stashd did not accept on {self.socket} within "
                            f"{READY_TIMEOUT_S} s:\n{self.log()}")
            time.sleep(0.01)

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def connect(self, **kwargs) -> stashd.Client:
        return stashd.connect(self.socket, **kwargs)

    def stop(self) -> Optional[int]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                self._log.close()
                return None
        self._log.close()
        return self.process.returncode


@pytest.fixture
def start_daemon(tmp_path):
    """start_daemon(*flags) -> Daemon; every daemon must exit 0 on SIGTERM at teardown."""
    started: List[Daemon] = []
    dirs: List[str] = []

    def start(*flags: str) -> Daemon:
        directory = str(tmp_path / f"d{len(started)}")
        if len(directory) > 90:  # sun_path holds 108 bytes
            directory = tempfile.mkdtemp(prefix="stashd-py-")
            dirs.append(directory)
        else:
            os.makedirs(directory)
        daemon = Daemon(directory, list(flags or DEFAULT_FLAGS))
        started.append(daemon)
        return daemon

    yield start
    failures = []
    for daemon in started:
        code = daemon.stop()
        if code != 0:
            failures.append(f"stashd on {daemon.socket} exited with {code}:\n{daemon.log()}")
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    assert not failures, "\n".join(failures)


@pytest.fixture
def daemon(start_daemon) -> Daemon:
    """A stashd with a 64 MiB pool, a 64 MiB host tier and 64 KiB pages."""
    return start_daemon()


@pytest.fixture
def client(daemon):
    with daemon.connect(label="pytest") as c:
        yield c


def wait_until(predicate, timeout_s: float, what: str):
    """Polls predicate() until it returns a truthy value; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


# The stashd.torch data modes the torch tests run in: name -> connect() keyword arguments.
TORCH_MODES = {
    "daemon-copy": {},
    "mapped": {"mode": "mapped"},
    # One job's sessions as a group: pages shared through the group's depot (docs/design.md).
    "mapped-group": {"mode": "mapped", "group": "pytest-job", "group_secret": b"p" * 32},
}


@pytest.fixture(params=sorted(TORCH_MODES))
def mode(request) -> str:
    """Each stashd.torch data mode in turn (see TORCH_MODES)."""
    return request.param


@pytest.fixture
def torch_client(daemon, mode):
    """A client on the default daemon in each data mode."""
    with daemon.connect(label=f"pytest-{mode}", **TORCH_MODES[mode]) as c:
        yield c

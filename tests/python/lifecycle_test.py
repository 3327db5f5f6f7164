"""A Python trainer that dies with stashes outstanding leaves no pages behind."""

from __future__ import annotations

import glob
import os
import select
import signal
import subprocess
import sys

import pytest

from conftest import PACKAGE_DIR, wait_until

# Each child stashes two activations and keeps them (no reload), reports, then waits for the
# parent. The torch child goes through the autograd hooks (forward only: the graph, and the
# stashes with it, stay alive); the raw child uses the client directly and skips torch's import.
TORCH_CHILD = r"""
import os, sys
import torch
import stashd, stashd.torch as stash_torch

client = stashd.connect(sys.argv[1], label="doomed")
w = torch.randn(256, 64, requires_grad=True)
with stash_torch.stash_saved_tensors(client, 256, torch.tensor(200)):
    a = stash_torch.mark(torch.randn(256, 64))
    b = stash_torch.mark(torch.randn(256, 64))
    loss = (w * a).sum() + (w * b).sum()
"""

RAW_CHILD = r"""
import os, sys
import stashd

client = stashd.connect(sys.argv[1], label="doomed")
source = stashd.Buffer(256 * 256)
for _ in range(2):
    client.stash(source, row_bytes=256, max_rows=256, count=200)
"""

REPORT_AND_WAIT = r"""
stats = client.stats()
print("stashed", stats.stashes_live, stats.pool_pages_used, flush=True)
sys.stdin.readline()
os._exit(0)  # no close(), no destructors: as abrupt as a crash short of a signal
"""


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        proc.kill()
        pytest.fail(f"the child printed nothing within {timeout_s} s")
    return proc.stdout.readline()


@pytest.mark.parametrize("death,child", [("os_exit", TORCH_CHILD), ("sigkill", RAW_CHILD)],
                         ids=["os_exit-torch", "sigkill-raw"])
def test_pages_return_when_a_python_client_dies(daemon, death, child):
    if child is TORCH_CHILD:
        pytest.importorskip("torch")
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_DIR + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-c", child + REPORT_AND_WAIT, daemon.socket],
                            env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = read_line(proc, 60.0)
        assert line.split()[:2] == ["stashed", "2"], line
        with daemon.connect(label="observer") as observer:
            assert observer.stats().pool_pages_used > 0
            if death == "sigkill":
                proc.send_signal(signal.SIGKILL)
            else:
                proc.stdin.write("exit\n")
                proc.stdin.flush()
            code = proc.wait(10)
            assert code == (-signal.SIGKILL if death == "sigkill" else 0)
            wait_until(lambda: observer.stats().pool_pages_used == 0, 5.0,
                       "the daemon to reclaim the dead client's pages")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # A client that dies never runs the destructors that shm_unlink its Buffers, and
        # nothing else unlinks them yet: remove the child's objects so the host stays clean.
        for leftover in glob.glob(f"/dev/shm/stashd-{proc.pid}-*"):
            os.unlink(leftover)

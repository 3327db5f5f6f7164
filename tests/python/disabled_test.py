"""$STASHD_DISABLED (the Slurm task prolog's word that no stashd runs for the job): connect()
returns a client that stashes nothing and says so once, and training runs as without stashd."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import stashd
from conftest import PACKAGE_DIR
from stashd.errors import NOT_FOUND


@pytest.fixture
def disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("STASHD_DISABLED", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stashd.DisabledWarning)
        client = stashd.connect(socket=str(tmp_path / "nobody.sock"))
    yield client
    client.close()


def test_connect_hands_out_a_client_that_stashes_nothing(disabled):
    assert isinstance(disabled, stashd.DisabledClient) and disabled.disabled
    assert "STASHD_DISABLED" in disabled.reason
    src = stashd.Buffer(1 << 16)
    done = disabled.stash(src, row_bytes=4096, max_rows=16, count=16, layer=1, name="x")
    assert done.overflowed and done.bytes == 0  # "nothing was taken: keep using the source"
    op = disabled.stash(src, row_bytes=4096, max_rows=16, count=16, wait=False)
    assert disabled.wait(op).overflowed
    with pytest.raises(stashd.StashError) as e:
        disabled.reload(done.ticket, src)
    assert e.value.code == NOT_FOUND
    begun = disabled.begin_step(3)
    assert not begun.step_overflow and not begun.step_spilled
    flags = disabled.step_flags()
    assert not (flags.overflow or flags.spilled or flags.unavailable)
    assert disabled.stats().pages_used == 0


def test_it_says_so_once_per_process(tmp_path):
    code = ("import warnings, stashd\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    a = stashd.connect(socket='/nonexistent/s.sock')\n"
            "    b = stashd.connect(socket='/nonexistent/s.sock', rank=1)\n"
            "said = [w for w in seen if issubclass(w.category, stashd.DisabledWarning)]\n"
            "print(len(said), type(a).__name__, type(b).__name__)\n"
            "print(said[0].message)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": PACKAGE_DIR, "STASHD_DISABLED": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    first, message = run.stdout.splitlines()[:2]
    assert first == "1 DisabledClient DisabledClient", run.stdout
    assert "stashes nothing" in message and "STASHD_DISABLED=1" in message


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_off_values_connect_as_usual(monkeypatch, tmp_path, value):
    monkeypatch.setenv("STASHD_DISABLED", value)
    with pytest.raises(stashd.Unavailable):
        stashd.connect(socket=str(tmp_path / "nobody.sock"), connect_timeout_ms=100)


def test_training_runs_as_without_a_stash(disabled):
    torch = pytest.importorskip("torch")
    import stashd.torch as stash_torch

    def step(client):
        torch.manual_seed(0)
        w = torch.randn(16, 8, requires_grad=True)
        x = torch.randn(32, 16)
        if client is None:
            out = (x @ w).relu()
        else:
            with stash_torch.stash_saved_tensors(client, 32, 20, name="experts", layer=0):
                h = x.clone()
                stash_torch.register(h)
                out = (h @ w).relu()
        out.pow(2).mean().backward()
        return w.grad

    expected = step(None)
    guard = stash_torch.overflow_guard(disabled)
    grads = []
    result = guard.run(0, lambda: grads.append(step(disabled)))
    assert not result.reran
    assert torch.equal(grads[0], expected)

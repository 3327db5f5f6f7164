"""overflow_guard: the step flags are all-reduced over a process group (two ranks over gloo),
and every rank reruns the step with the stash off when any rank overflowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd.torch as stash_torch
from conftest import TORCH_MODES
from moe import make_params, moe_model

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overflow_guard_worker.py")
WORKER_TIMEOUT_S = 120  # a bound on a hang, not synchronisation


def run_ranks(sockets, tmp_path, mode, seed=11):
    init_file = str(tmp_path / "gloo-init")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(WORKER), os.pardir, os.pardir, "client", "python"),
         env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, WORKER, str(rank), str(len(sockets)), init_file,
                               socket, str(seed), json.dumps({k: v.hex() if isinstance(v, bytes) else v
                                           for k, v in TORCH_MODES[mode].items()})],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for rank, socket in enumerate(sockets)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank of the overflow_guard test hung")
        assert p.returncode == 0, out + err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_one_rank_overflowing_reruns_the_step_on_both_ranks(start_daemon, tmp_path, mode):
    tiny = start_daemon("--pool-bytes=256KiB", "--host-tier-bytes=0", "--page-bytes=64KiB")
    roomy = start_daemon()
    r0, r1 = run_ranks([tiny.socket, roomy.socket], tmp_path, mode)
    for r in (r0, r1):
        assert r["attempts"] == 2 and r["reran"], r
        assert r["ranks_overflowed"] == 1, r  # all-reduced: both ranks saw rank 0's overflow
        assert r["exact"], r                  # overflow costs memory, never correctness
        first, rerun = r["per_attempt"]
        assert first["stash_on"] and not rerun["stash_on"], r
        assert rerun["stashes"] == 0 and not rerun["overflow"], r
    assert r0["per_attempt"][0]["overflow"] and not r1["per_attempt"][0]["overflow"]
    assert r1["per_attempt"][0]["stashes"] > 0


def test_no_overflow_means_one_attempt(start_daemon, tmp_path, mode):
    a, b = start_daemon(), start_daemon()
    for r in run_ranks([a.socket, b.socket], tmp_path, mode):
        assert r["attempts"] == 1 and r["ranks_overflowed"] == 0 and r["exact"], r


def test_guard_without_a_process_group_reruns_locally_after_the_daemon_dies(start_daemon, mode):
    d = start_daemon()
    c = d.connect(**TORCH_MODES[mode])
    g = torch.Generator().manual_seed(3)
    layers = [make_params(g, 16, 16, 4) for _ in range(2)]
    x = torch.randn(32, 16, generator=g, dtype=torch.float64)
    params = [t for p in layers for t in p.tensors()]
    moe_model(x, layers, 2).sum().backward()
    expected = [t.grad.clone() for t in params]

    def zero_grad():
        for t in params:
            t.grad = None

    zero_grad()
    calls = []

    def step():
        out = moe_model(x, layers, 2, c)
        if not calls:
            assert d.stop() == 0  # the daemon dies between forward and backward
        calls.append(1)
        out.sum().backward()

    guard = stash_torch.overflow_guard(c, on_rerun=zero_grad)
    if mode == "daemon-copy":  # the rows lived in the daemon: backward failed, rerun
        with pytest.warns(stash_torch.StashWarning, match="cannot be reached"):
            result = guard.run(0, step)
        assert result.attempts == 2 and result.ranks_unavailable == 1
    else:  # mapped: the rank's chunks outlive the daemon, backward reloads from them
        result = guard.run(0, step)
        assert result.attempts == 1 and result.ranks_unavailable == 0
    assert all(torch.equal(e, t.grad) for e, t in zip(expected, params))
    c.close()


def test_guard_rejects_unknown_flags(client):
    with pytest.raises(ValueError, match="rerun_on"):
        stash_torch.overflow_guard(client, rerun_on=("overflows",))
    with pytest.raises(TypeError):
        stash_torch.overflow_guard(object())


class _OnStreamClient:
    """What stashd.torch's state reads of a client in mapped mode on the cuda backend, with the
    step's overflow flag as given (the GPU path itself runs in tests/gpu)."""

    closed = False
    on_stream = True
    device = 0

    def __init__(self, overflow: bool):
        self.overflow = overflow
        self._extensions: dict = {}

    def step_flags(self):
        import stashd
        return stashd.StepFlags(self.overflow, False, False)


def test_an_unguarded_overflow_on_the_cuda_path_warns_once_that_gradients_are_wrong():
    import warnings

    from stashd.torch.state import StashWarning, _TorchState

    client = _OnStreamClient(overflow=True)
    state = _TorchState(client)
    with pytest.warns(StashWarning, match="gradients are wrong.*overflow_guard"):
        state.begin_step(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state.begin_step(2)  # once per client
        other, clean = _OnStreamClient(overflow=True), _OnStreamClient(overflow=False)
        guarded = _TorchState(other)  # the state holds its client weakly: `other` keeps it
        guarded.guarded = True  # overflow_guard reruns such steps: nothing to say
        guarded.begin_step(1)
        _TorchState(clean).begin_step(1)

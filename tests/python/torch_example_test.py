"""examples/python/megatron_moe.py, the README's Megatron-style example, runs as written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # the example needs PyTorch

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                       "examples", "python", "megatron_moe.py")
RUN_TIMEOUT_S = 300  # a bound on a hang, not synchronisation


def run_example(daemon, *args):
    env = dict(os.environ, STASHD_SOCKET=daemon.socket)
    env.pop("LOCAL_RANK", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(EXAMPLE), os.pardir, os.pardir, "client", "python"),
         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, EXAMPLE, *args], env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)


def test_the_readme_example_trains_with_parity(daemon):
    run = run_example(daemon, "--steps", "2", "--layers", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    # 3 stashes per layer and step: FC1's input, FC2's input, the permuted probabilities.
    assert "2 steps, 2 layers: 12 stashes, 12 reloads, 0 overflows, 0 reruns" in run.stdout
    assert "parity OK" in run.stdout
    assert "StashWarning" not in run.stderr, run.stderr


def test_the_example_reruns_overflowed_steps_and_keeps_parity(start_daemon):
    d = start_daemon("--pool-bytes=128KiB", "--host-tier-bytes=0", "--page-bytes=64KiB")
    run = run_example(d, "--steps", "2", "--layers", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 reruns" in run.stdout and "parity OK" in run.stdout

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


def test_the_example_trains_through_a_daemon_kill_and_keeps_parity(tmp_path):
    """stashd is SIGKILLed and restarted on its socket mid-run: the example finishes, its
    client reconnects at the next step (client.stats() answers for the new session, or the
    example says why not), at most the step that lost stashes reran, and parity holds."""
    import json
    import signal

    from conftest import DEFAULT_FLAGS, Daemon, bin_dir, wait_until

    os.makedirs(tmp_path / "d")
    d = Daemon(str(tmp_path / "d"), list(DEFAULT_FLAGS))  # not the fixture's: it is SIGKILLed
    stashctl = os.path.join(bin_dir(), "client", "stashctl", "stashctl")

    def stashes_taken():
        out = subprocess.run([stashctl, f"--socket={d.socket}", "stats", "--json"],
                             capture_output=True, text=True, timeout=30).stdout
        return out and int(json.loads(out)["daemon"]["stashes"]) > 0

    env = dict(os.environ, STASHD_SOCKET=d.socket)
    env.pop("LOCAL_RANK", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(EXAMPLE), os.pardir, os.pardir, "client", "python"),
         env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, EXAMPLE, "--steps", "30", "--layers", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    restarted = None
    try:
        wait_until(stashes_taken, RUN_TIMEOUT_S, "the example to stash")
        d.process.send_signal(signal.SIGKILL)
        assert d.stop() == -signal.SIGKILL
        restarted = Daemon(str(tmp_path / "d"), list(DEFAULT_FLAGS))
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()
    assert proc.returncode == 0, out + err
    assert "parity OK" in out, out + err
    # The stats are the new session's: the client reconnected and stashed through it.
    assert "no stats" not in out, out
    stashes = int(out.split(" stashes,")[0].rsplit(" ", 1)[-1])
    assert stashes > 0, out
    # Steps that began while no daemon answered rerun (the stash was unavailable), and so may
    # the step the kill interrupted; once the new daemon answers, every step runs once (today
    # every remaining step reran and client.stats() raised).
    reruns = int(out.split(" reruns")[0].rsplit(" ", 1)[-1])
    assert reruns < 15, out

"""Recovery under a guarded trainer (issue 21), in both modes: the daemon is killed, restarted,
or drained and then restarted during a run of overflow_guard steps. Only a step that lost
stashes (daemon-copy, killed mid-step) runs twice; every other step runs once, through the new
daemon, with gradients exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd
import stashd.torch as stash_torch
from conftest import DEFAULT_FLAGS, TORCH_MODES, Daemon, bin_dir, wait_until
from moe import make_params, moe_model

STEPS = 6
EVENT_STEP = 2


def stashctl(socket, *args) -> str:
    run = subprocess.run([os.path.join(bin_dir(), "client", "stashctl", "stashctl"),
                          f"--socket={socket}", *args], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def sessions_listed(socket) -> int:
    return len(json.loads(stashctl(socket, "sessions", "--json")).get("sessions", []))


class Run:
    """One guarded trainer: a two-layer MoE whose gradients are checked against a run without
    the stash at every step. `mid[step]()` runs once after that step's first forward,
    `before[step]()` before its begin_step."""

    def __init__(self, daemon, mode):
        self.client = daemon.connect(**TORCH_MODES[mode])
        g = torch.Generator().manual_seed(5)
        self.layers = [make_params(g, 16, 16, 4) for _ in range(2)]
        self.x = torch.randn(32, 16, generator=g, dtype=torch.float64)
        self.params = [t for p in self.layers for t in p.tensors()]
        moe_model(self.x, self.layers, 2).sum().backward()
        self.expected = [t.grad.clone() for t in self.params]
        self.zero_grad()
        self.sessions = []  # per step: the live session after it (None: none open)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    def steps(self, mid=None, before=None):
        mid, before = dict(mid or {}), dict(before or {})
        guard = stash_torch.overflow_guard(self.client, on_rerun=self.zero_grad)
        attempts = []
        for step in range(STEPS):
            def fn():
                out = moe_model(self.x, self.layers, 2, self.client)
                event = mid.pop(step, None)
                if event is not None:
                    event()
                out.sum().backward()

            if step in before:
                before.pop(step)()
            self.zero_grad()
            result = guard.run(step, fn)
            attempts.append(result.attempts)
            assert not result.ranks_overflowed, (step, result)
            assert all(torch.equal(e, t.grad) for e, t in zip(self.expected, self.params)), step
            try:
                stats = self.client.stats()  # the live session's, after a reconnect too
                assert stats.stashes >= 0
                self.sessions.append(self.client.session_id)
            except stashd.StashError:
                self.sessions.append(None)  # drained: no session open
        return attempts


def restart(old: Daemon) -> Daemon:
    """stashd again on the old one's socket and directory."""
    return Daemon(os.path.dirname(old.socket), list(DEFAULT_FLAGS))


@pytest.mark.filterwarnings("ignore::stashd.torch.StashWarning")
def test_a_kill_mid_step_reruns_only_that_step(tmp_path, mode):
    os.makedirs(tmp_path / "d")
    d = Daemon(str(tmp_path / "d"), list(DEFAULT_FLAGS))  # not the fixture's: it is SIGKILLed
    run = Run(d, mode)
    new = []

    def kill_and_restart():
        d.process.send_signal(signal.SIGKILL)
        assert d.stop() == -signal.SIGKILL
        new.append(restart(d))

    try:
        attempts = run.steps(mid={EVENT_STEP: kill_and_restart})
    finally:
        run.client.close()
        for n in new:
            assert n.stop() == 0, n.log()
    # Daemon-copy: that step's rows lived in the daemon (its backward failed: rerun with the
    # stash off). Mapped: the rank's chunks outlived the daemon. Every later step runs once.
    lost = 2 if mode == "daemon-copy" else 1
    assert attempts == [1] * EVENT_STEP + [lost] + [1] * (STEPS - EVENT_STEP - 1), attempts
    assert None not in run.sessions[EVENT_STEP + 1:], run.sessions
    assert run.sessions[-1] != run.sessions[0]
    assert len(set(run.sessions[EVENT_STEP + 1:])) == 1


def test_a_restart_between_steps_runs_every_step_once(start_daemon, mode):
    d = start_daemon()
    run = Run(d, mode)
    new = []

    def stop_and_restart():
        assert d.stop() == 0  # SIGTERM: drains (nothing held between steps), then stops
        new.append(restart(d))

    try:
        attempts = run.steps(before={EVENT_STEP: stop_and_restart})
    finally:
        run.client.close()
        for n in new:
            assert n.stop() == 0, n.log()
    assert attempts == [1] * STEPS, attempts
    assert run.sessions[EVENT_STEP] != run.sessions[0] and None not in run.sessions


def test_a_drain_mid_step_then_a_restart_runs_every_step_once(start_daemon, mode):
    d = start_daemon()
    run = Run(d, mode)
    new = []

    def drain():
        assert "undrain" in stashctl(d.socket, "drain")

    def stop_and_restart():
        # The drained rank ended its session once its stashes were back (mapped: at the step
        # boundary after): the daemon lists none while the trainer lives, and stops at once.
        wait_until(lambda: sessions_listed(d.socket) == 0, 10, "the drained session to end")
        assert d.stop() == 0
        new.append(restart(d))

    try:
        attempts = run.steps(mid={EVENT_STEP: drain}, before={EVENT_STEP + 2: stop_and_restart})
    finally:
        run.client.close()
        for n in new:
            assert n.stop() == 0, n.log()
    # Nothing was lost: the drained steps kept their tensors without a flag, no step reran.
    assert attempts == [1] * STEPS, attempts
    assert run.sessions[EVENT_STEP + 1] is None, run.sessions  # drained: no session
    assert None not in run.sessions[EVENT_STEP + 2:], run.sessions
    assert run.sessions[-1] != run.sessions[0]


def test_session_and_step_flags_describe_a_restarted_daemon(tmp_path, mode):
    # The C API's stash_get_session and stash_step_lost through client.session() and
    # step_flags(): the step whose stashes a killed daemon held says so (daemon-copy only:
    # mapped keeps them in its chunks), and after the next begin_step the session's id and
    # geometry are the new daemon's (here a pool four times the size).
    os.makedirs(tmp_path / "d")
    d = Daemon(str(tmp_path / "d"), list(DEFAULT_FLAGS))
    client = d.connect(**TORCH_MODES[mode])
    new = []
    try:
        before = client.session()
        assert before.session_id == client.session_id != ""
        assert before.page_bytes == 64 << 10 and before.pool_pages == (64 << 20) // (64 << 10)
        g = torch.Generator().manual_seed(9)
        layers = [make_params(g, 16, 16, 4) for _ in range(2)]
        x = torch.randn(32, 16, generator=g, dtype=torch.float64)
        client.begin_step(0)
        out = moe_model(x, layers, 2, client)  # its saved tensors are stashed
        assert not client.step_flags().unavailable
        d.process.send_signal(signal.SIGKILL)
        assert d.stop() == -signal.SIGKILL
        flags = [f for f in DEFAULT_FLAGS if not f.startswith("--pool-bytes")]
        new.append(Daemon(os.path.dirname(d.socket), flags + ["--pool-bytes=256MiB"]))
        if mode == "daemon-copy":
            wait_until(lambda: client.step_flags().unavailable, 10, "the lost step's flag")
        else:
            out.sum().backward()  # the rank's chunks outlived the daemon
            assert not client.step_flags().unavailable
        del out
        client.begin_step(1)
        wait_until(lambda: client.session().session_id != before.session_id, 10,
                   "a new session")
        after = client.session()
        assert after.session_id == client.session_id
        assert after.pool_pages == (256 << 20) // (64 << 10), after
        assert not client.step_flags().unavailable
        assert client.stats().stashes == 0
    finally:
        client.close()
        for n in new:
            assert n.stop() == 0, n.log()

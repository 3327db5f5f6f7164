"""Groups of sessions (issue 41, identity): stashd.connect(group=, group_secret=), the
environment's $STASHD_GROUP / $STASHD_GROUP_SECRET, and stashd.torch.connect() forming the job's
group from its launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import stashd
from conftest import bin_dir

SECRET = bytes(range(32))


def sessions_json(socket: str) -> list:
    run = subprocess.run([os.path.join(bin_dir(), "client", "stashctl", "stashctl"),
                          f"--socket={socket}", "sessions", "--json"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout).get("sessions", [])


@pytest.mark.parametrize("kwargs, match", [
    ({"group": 41, "group_secret": SECRET}, "group must be a str"),
    ({"group": "job", "group_secret": "x" * 32}, "group_secret must be bytes"),
    ({"group": "job"}, "needs a group_secret of exactly 32 bytes.*; got none"),
    ({"group": "job", "group_secret": SECRET[:31]}, "exactly 32 bytes.*; got 31 bytes"),
    ({"group": "job", "group_secret": SECRET + b"!"}, "got 33 bytes"),
    ({"group_secret": SECRET}, "group_secret is given but group is not"),
    ({"group": "job 41", "group_secret": SECRET}, "is not 1-128 characters"),
    ({"group": "g" * 129, "group_secret": SECRET}, "is not 1-128 characters"),
])
def test_connect_checks_the_group_arguments_before_connecting(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        stashd.connect(str(tmp_path / "nobody.sock"), **kwargs)


def test_sessions_with_the_secret_join_and_a_wrong_secret_is_refused(daemon):
    with daemon.connect(group="job.41", group_secret=SECRET) as first, \
            daemon.connect(group="job.41", group_secret=bytearray(SECRET)), \
            daemon.connect(label="alone"):
        wrong = bytes(SECRET[:31]) + b"\xff"
        with pytest.raises(stashd.StashError) as info:
            daemon.connect(group="job.41", group_secret=wrong)
        assert info.value.code_name == "PERMISSION_DENIED"
        assert "wrong group secret for group job.41" in info.value.message
        rows = sessions_json(daemon.socket)
        assert sorted(r.get("group", "") for r in rows) == ["", "job.41", "job.41"]
        assert first.stats().stashes == 0  # the first member goes on


def test_the_environment_names_the_group_and_a_bad_secret_is_refused(daemon, monkeypatch):
    monkeypatch.setenv("STASHD_GROUP", "env-job")
    monkeypatch.setenv("STASHD_GROUP_SECRET", "zz" * 32)
    with pytest.raises(stashd.StashError) as info:
        daemon.connect()
    assert info.value.code_name == "INVALID_ARGUMENT"
    assert "$STASHD_GROUP_SECRET must be 64 hex characters" in info.value.message
    monkeypatch.setenv("STASHD_GROUP_SECRET", SECRET.hex())
    with daemon.connect():
        assert [r.get("group") for r in sessions_json(daemon.socket)] == ["env-job"]


def test_launcher_group_names(monkeypatch):
    pytest.importorskip("torch")
    from stashd.torch import launcher_group_name
    for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
                 "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    assert launcher_group_name() is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert launcher_group_name() == "slurm:4242"
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    assert launcher_group_name() == "slurm:4242.3"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert launcher_group_name() == "torchrun:none"
    monkeypatch.setenv("MASTER_ADDR", "node 7")  # characters the daemon refuses become "_"
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert launcher_group_name() == "torchrun:none@node_7:29500"


def test_without_torch_distributed_no_group_is_formed(daemon, monkeypatch):
    pytest.importorskip("torch")
    import stashd.torch as stash_torch
    monkeypatch.delenv("STASHD_GROUP", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-1")
    assert stash_torch.job_group() is None
    with stash_torch.connect(daemon.socket):
        assert [r.get("group", "") for r in sessions_json(daemon.socket)] == [""]


WORKER = r"""
import json, os, subprocess, sys
import torch.distributed as dist
import stashd.torch as stash_torch
rank, world, init_file, socket, stashctl = sys.argv[1:6]
dist.init_process_group("gloo", init_method="file://" + init_file, rank=int(rank),
                        world_size=int(world))
client = stash_torch.connect(socket, rank=int(rank))
dist.barrier()
if rank == "0":
    out = subprocess.run([stashctl, "--socket=" + socket, "sessions", "--json"],
                         capture_output=True, text=True, timeout=30).stdout
    print(json.dumps([r.get("group", "") for r in json.loads(out)["sessions"]]), flush=True)
dist.barrier()
client.close()
dist.destroy_process_group()
"""


def test_torch_connect_forms_the_jobs_group_with_a_secret_from_rank_0(daemon, tmp_path):
    """Two gloo ranks of a torchrun job: both join "torchrun:<run id>@<addr>:<port>" with the
    secret rank 0 drew and broadcast (a wrong one would be refused)."""
    pytest.importorskip("torch")
    env = dict(os.environ)
    env.pop("STASHD_GROUP", None)
    env.update(TORCHELASTIC_RUN_ID="run-41", MASTER_ADDR="127.0.0.1", MASTER_PORT="29541",
               PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), os.pardir,
                                                        os.pardir, "client", "python"),
                                           env.get("PYTHONPATH", "")]))
    stashctl = os.path.join(bin_dir(), "client", "stashctl", "stashctl")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(rank), "2",
                               str(tmp_path / "gloo-init"), daemon.socket, stashctl],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)  # a bound on a hang, not synchronisation
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank of the group test hung")
        assert p.returncode == 0, out + err
        outs.append(out)
    groups = json.loads(outs[0].strip().splitlines()[-1])
    assert groups == ["torchrun:run-41@127.0.0.1:29541"] * 2

"""Mapped mode on the cuda backend through the Python client (stash_device / reload_device /
release / begin_step on a stream, step_flags) against stashd --backend=cuda, both on the CUDA
driver stand-in (tests/cuda_standin), which runs the library's kernels as their host twins. The
rank runs in a child process (cuda_mapped_worker.py): the stand-in must be first on
LD_LIBRARY_PATH when a process starts. The stashd.torch path over real CUDA tensors runs in the
GPU check (tests/gpu/torch_cuda_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import bin_dir

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_mapped_worker.py")
FLAGS = ("--backend=cuda", "--page-bytes=64KiB", "--pool-bytes=8MiB", "--chunk-bytes=2MiB",
         "--host-tier-bytes=0")


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The driver stand-in first on LD_LIBRARY_PATH of every child started from here."""
    folder = os.path.join(bin_dir(), "tests", "cuda_standin", "as-libcuda")
    if not os.path.exists(os.path.join(folder, "libcuda.so.1")):
        pytest.skip("the driver stand-in is built only with CUDA (STASH_ENABLE_CUDA)")
    registry = tmp_path / "registry"
    registry.mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", folder)
    monkeypatch.setenv("STASH_STANDIN_REGISTRY", str(registry))


def test_device_buffers_page_on_the_callers_stream_and_overflow_flags_the_step(standin,
                                                                               start_daemon):
    daemon = start_daemon(*FLAGS)
    run = subprocess.run([sys.executable, WORKER, daemon.socket], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{daemon.log()}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["on_stream"] is True
    assert seen["stash_tier"] == "NONE", "answered at once: only the GPU knows the tier"
    assert seen["round_trip"] is True, "rows back byte for byte, the tail zeroed"
    assert seen["flags_after_fit"] is False
    assert seen["overflow_left_destination"] is True
    assert seen["flags_after_overflow"] is True, "the step is flagged before it ends"
    assert seen["flags_next_step"] is False, "flags are per step"
    assert seen["reload_after_release"] == "NOT_FOUND"
    assert "no ready or done event" in seen["events_on_a_stream"]
    assert seen["graphs_destroyed"] is True

"""scripts/wheel: the wheel installs into a fresh venv and connects, with nothing else on the path.

The venv's interpreter runs with a clean environment (no PYTHONPATH, STASHD_CLIENT_LIB,
STASHD_BIN_DIR or LD_LIBRARY_PATH), so the package and libstash_client.so can only come from the
wheel, and the library must find its own dependencies through its RUNPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from conftest import REPO_ROOT, bin_dir

SCRIPT = os.path.join(REPO_ROOT, "scripts", "wheel")

CHECK = r"""
import sys, stashd, stashd._lib as L
client = stashd.connect(socket=sys.argv[1], rank=5, label="from-wheel")
path = L.lib()._name
print("library", path)
assert path.startswith(sys.prefix), path
stats = client.stats()
print("pages_live", stats.pages_live)
client.close()
"""


def test_wheel_installs_in_a_fresh_venv_and_connects(daemon, tmp_path):
    out = tmp_path / "wheels"
    built = subprocess.run([SCRIPT, bin_dir(), str(out)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = list(out.glob("stashd-*-py3-none-linux_x86_64.whl"))
    assert len(wheels) == 1, built.stdout
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "stashd/libstash_client.so" in names
    assert any(n.startswith("stashd/lib/libgrpc++.so") for n in names), names
    assert not any(n.startswith("stashd/lib/libc.so") for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
                          "--no-deps", str(wheels[0])], capture_output=True, text=True, env=clean,
                         timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    run = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK, daemon.socket],
                         capture_output=True, text=True, env=clean, cwd=str(tmp_path),
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pages_live 0" in run.stdout, run.stdout

"""scripts/wheel and client/python's packaging, the way a pip user meets them.

The venv's interpreter runs with a clean environment (no PYTHONPATH, STASHD_CLIENT_LIB,
STASHD_BIN_DIR or LD_LIBRARY_PATH), so the package, libstash_client.so and stashctl can only come
from the wheel, and the library must find its own dependencies through its RUNPATH. The venv
sees the system's site-packages, so Debian's torch is there for the import-order tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from typing import Dict, Tuple

import pytest

from conftest import PACKAGE_DIR, REPO_ROOT, bin_dir

SCRIPT = os.path.join(REPO_ROOT, "scripts", "wheel")
# Libraries a trainer loads itself; the wheel must carry none of them under these names.
SHADOWING = ("libstdc++.so", "libgcc_s.so", "libssl.so", "libcrypto.so", "libz.so",
             "libprotobuf.so")

CONNECT = r"""
import sys, stashd, stashd._lib as L
client = stashd.connect(socket=sys.argv[1], rank=5, label="from-wheel")
path = L.lib()._name
print("library", path)
assert path.startswith(sys.prefix), path
stats = client.stats()
print("pages_live", stats.pages_live)
client.close()
"""

# Runs stashd and torch in the order argv[2] names, then reports what the process mapped.
IMPORT_ORDER = r"""
import re, sys
socket, order = sys.argv[1], sys.argv[2]
def use_stashd():
    import stashd
    client = stashd.connect(socket=socket, label="order-" + order)
    buf = stashd.Buffer(1 << 16)
    done = client.stash(buf, row_bytes=4096, max_rows=16, count=16)
    client.reload(done.ticket, buf)
    client.close()
def use_torch():
    import torch
    x = torch.arange(12.0).reshape(3, 4)
    assert float((x @ x.T).sum()) == 1134.0
    torch.nn.functional.gelu(x).sum().item()
for step in order.split(","):
    {"stashd": use_stashd, "torch": use_torch}[step]()
mapped = set()
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and parts[5].startswith("/"):
        mapped.add(parts[5])
for path in sorted(mapped):
    if re.search(r"lib(stdc\+\+|gcc_s|ssl|crypto)[.-]", path):
        print("mapped", path)
"""


def _version_needs(path: str) -> Dict[str, Tuple[int, ...]]:
    """The newest GLIBC_ and GLIBCXX_ versions an ELF file needs (its version-needs section);
    nothing for a file readelf cannot read (a dangling link, a linker script)."""
    text = subprocess.run(["readelf", "--version-info", "--wide", path], capture_output=True,
                          text=True).stdout
    needed = text.split("Version needs section", 1)[1] if "Version needs section" in text else ""
    out: Dict[str, Tuple[int, ...]] = {}
    for kind, version in re.findall(r"Name: (GLIBC|GLIBCXX)_([0-9.]+)", needed):
        v = tuple(int(x) for x in version.split("."))
        out[kind] = max(out.get(kind, v), v)
    return out


def _version_defs(path: str) -> set:
    text = subprocess.run(["readelf", "--version-info", "--wide", path], check=True,
                          capture_output=True, text=True).stdout
    defined = text.split("Version definition section", 1)[1].split("Version needs section")[0]
    return set(re.findall(r"Name: (\S+)", defined))


def _soname(path: str) -> str:
    text = subprocess.run(["readelf", "-d", "--wide", path], check=True, capture_output=True,
                          text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", text)
    return m.group(1) if m else ""


class Installed:
    def __init__(self, wheel: str, venv: str, home: str, output: str):
        self.wheel = wheel
        self.venv = venv
        self.python = os.path.join(venv, "bin", "python")
        self.env = {"PATH": f"{os.path.join(venv, 'bin')}:/usr/bin:/bin", "HOME": home}
        self.cwd = home
        self.output = output  # what scripts/wheel printed

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env=self.env,
                              cwd=self.cwd, timeout=timeout)

    def site_packages(self) -> str:
        out = self.run(self.python, "-c", "import stashd, os; print(os.path.dirname("
                                          "os.path.dirname(stashd.__file__)))")
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """The wheel scripts/wheel builds from the build tree, installed in a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    out = tmp / "wheels"
    built = subprocess.run([SCRIPT, bin_dir(), str(out)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = list(out.glob("stashd-*.whl"))
    assert len(wheels) == 1, built.stdout
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    home = tmp / "home"
    home.mkdir()
    inst = Installed(str(wheels[0]), str(venv), str(home), built.stdout)
    pip = inst.run(inst.python, "-m", "pip", "install", "--no-index", "--no-deps", inst.wheel,
                   timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return inst


def test_wheel_installs_in_a_fresh_venv_and_connects(installed, daemon):
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "stashd/libstash_client.so" in names
    assert "stashd/bin/stashctl" in names
    assert any(re.match(r"stashd/lib/libgrpc\+\+-stashd\.so", n) for n in names), names
    assert not any(n.startswith("stashd/lib/libc.so") for n in names), names
    run = installed.run(installed.python, "-c", CONNECT, daemon.socket)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pages_live 0" in run.stdout, run.stdout


def test_wheel_ships_nothing_that_shadows_the_trainers_libraries(installed):
    """No bundled file answers to a SONAME the trainer's own libraries load (libstdc++,
    OpenSSL, protobuf...): the bundled ones are renamed, the C++ runtime is the system's."""
    lib_dir = os.path.join(installed.site_packages(), "stashd", "lib")
    sonames = {name: _soname(os.path.join(lib_dir, name)) for name in os.listdir(lib_dir)}
    assert sonames, "no bundled libraries"
    for name, soname in sonames.items():
        assert not name.startswith(SHADOWING), f"the wheel carries {name}"
        assert "-stashd.so" in soname, f"{name} answers to the SONAME {soname!r}"
    assert not any("libstdc++" in n or "libgcc_s" in n for n in sonames), sorted(sonames)


@pytest.mark.parametrize("order", ["stashd,torch", "torch,stashd"])
def test_stashd_and_torch_load_together_in_either_order(installed, daemon, order):
    """stashd.connect() before `import torch` must not leave torch an older libstdc++ (or a
    foreign OpenSSL): the process maps the system's, which defines the newest GLIBCXX_ version
    torch's libraries need."""
    torch = installed.run(installed.python, "-c", "import torch, os; print(os.path.dirname("
                                                  "torch.__file__))")
    if torch.returncode != 0:
        pytest.skip(f"no torch for {installed.python}: {torch.stderr.strip()[-200:]}")
    torch_dir = torch.stdout.strip()
    newest = (3, 4)
    for d, _, files in os.walk(torch_dir):
        for f in files:
            if f.endswith(".so") or ".so." in f:
                newest = max(newest, _version_needs(os.path.join(d, f)).get("GLIBCXX", newest))
    newest_name = "GLIBCXX_" + ".".join(map(str, newest))

    run = installed.run(installed.python, "-c", IMPORT_ORDER, daemon.socket, order)
    assert run.returncode == 0, run.stdout + run.stderr
    mapped = [line.split(" ", 1)[1] for line in run.stdout.splitlines()
              if line.startswith("mapped ")]
    cxx = [p for p in mapped if "libstdc++" in p]
    assert len(cxx) == 1, mapped
    assert not cxx[0].startswith(installed.venv), f"the wheel's libstdc++ was loaded: {cxx}"
    assert newest_name in _version_defs(cxx[0]), (cxx[0], newest_name)
    for path in mapped:
        if path.startswith(installed.venv):
            assert "-stashd.so" in os.path.basename(path), path


def test_wheel_is_tagged_with_the_glibc_its_files_need(installed, tmp_path):
    """The tag is manylinux_2_N, N the newest GLIBC_2.N any file needs, so pip on an older
    glibc refuses the wheel instead of installing one that cannot load."""
    newest = (2, 0)
    with zipfile.ZipFile(installed.wheel) as z:
        z.extractall(tmp_path / "x")
    for d, _, files in os.walk(tmp_path / "x" / "stashd"):
        for f in files:
            if f.endswith(".so") or ".so." in f or f == "stashctl":
                newest = max(newest, _version_needs(os.path.join(d, f)).get("GLIBC", newest))
    assert newest > (2, 2)
    tag = f"manylinux_{newest[0]}_{newest[1]}_x86_64"
    assert os.path.basename(installed.wheel).endswith(f"-py3-none-{tag}.whl"), installed.wheel
    assert f"needs glibc >= {newest[0]}.{newest[1]}" in installed.output

    def install_for(platform: str) -> subprocess.CompletedProcess:
        target = tmp_path / platform
        return installed.run(installed.python, "-m", "pip", "install", "--no-index", "--no-deps",
                             "--only-binary=:all:", f"--platform={platform}", "--target",
                             str(target), installed.wheel, timeout=300)

    older = f"manylinux_{newest[0]}_{newest[1] - 1}_x86_64"
    refused = install_for(older)
    assert refused.returncode != 0, refused.stdout
    assert "not a supported wheel" in refused.stdout + refused.stderr, refused.stderr
    accepted = install_for(tag)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr


def test_pip_install_of_the_source_directory_refuses_and_names_scripts_wheel(installed,
                                                                            tmp_path):
    """`pip install client/python` (outside the checkout, where no build tree is) would
    install a package that cannot load its library: it refuses and says what to run."""
    source = tmp_path / "python"
    shutil.copytree(PACKAGE_DIR, source,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    pip = installed.run(str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
                        "--no-deps", "--no-build-isolation", str(source), timeout=300)
    assert pip.returncode != 0, pip.stdout
    assert "./scripts/wheel" in pip.stdout + pip.stderr, pip.stdout + pip.stderr
    listed = installed.run(str(venv / "bin" / "python"), "-m", "pip", "show", "stashd")
    assert listed.returncode != 0, listed.stdout


def test_version_module_main_and_stashctl_come_with_the_wheel(installed, daemon):
    code = ("import stashd, importlib.metadata as m; "
            "print(stashd.__version__, m.version('stashd'), stashd.version())")
    versions = installed.run(installed.python, "-c", code)
    assert versions.returncode == 0, versions.stderr
    package, dist, library = versions.stdout.split()
    assert package == dist == library, versions.stdout
    with open(os.path.join(REPO_ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        project = re.search(r"project\(stashd VERSION ([0-9.]+)", f.read()).group(1)
    assert package == project

    env_socket = dict(installed.env, STASHD_SOCKET=daemon.socket)
    doctor = subprocess.run([installed.python, "-m", "stashd", "--json"], capture_output=True,
                            text=True, env=env_socket, cwd=installed.cwd, timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    facts = json.loads(doctor.stdout)
    assert facts["version"] == package
    assert facts["library"].startswith(installed.venv)
    assert facts["socket"] == daemon.socket and facts["socket_source"] == "$STASHD_SOCKET"
    assert facts["socket_state"] == "present"
    assert facts["daemon"] == "reachable"
    assert facts["stats"]["pool_pages_total"] > 0

    text = subprocess.run([installed.python, "-m", "stashd"], capture_output=True, text=True,
                          env=env_socket, cwd=installed.cwd, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"stashd {package}" in text.stdout and "daemon: reachable" in text.stdout

    missing = os.path.join(installed.cwd, "nobody.sock")
    down = installed.run(installed.python, "-m", "stashd", f"--socket={missing}",
                         "--timeout-ms=200")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "missing" in down.stdout and "daemon: unreachable" in down.stdout, down.stdout

    stashctl = shutil.which("stashctl", path=installed.env["PATH"].split(":")[0])
    assert stashctl, "the wheel installed no stashctl command"
    health = installed.run(stashctl, f"--socket={daemon.socket}", "health")
    assert health.returncode == 0, health.stdout + health.stderr
    assert "SERVING" in health.stdout
    # The first line is the client's version; the second the daemon's (none here).
    assert installed.run(stashctl, "--version").stdout.splitlines()[0].split()[-1] == package

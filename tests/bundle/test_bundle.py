"""Checks of scripts/bundle: the relocatable folder it makes from a build tree.

Run: ctest --test-dir build/release -L bundle   (or, by hand,
STASHD_BIN_DIR=build/release /usr/bin/python3 -m pytest -q tests/bundle/test_bundle.py)

The bundle is made once, into a temporary directory, from the build tree STASHD_BIN_DIR names.
The checks: under 64 MiB; every ELF carries its RUNPATH; every library that is not glibc's, the
NVIDIA driver's or the C++ runtime (libstdc++, libgcc_s: the node's, or lib/fallback/'s through
./run) resolves inside the bundle (none from the system, e.g. gRPC, protobuf, abseil, spdlog,
fmt, c-ares, re2, OpenSSL, zlib); binaries run with an empty environment; a daemon, stashctl, the
demo and the Python package from the bundle talk to each other; and all of it still works after
the folder is moved, also through ./run. Which runtime ./run picks, and what REQUIRES says about
each case: test_runtime.py. Skips only when patchelf is missing.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(os.environ.get("STASH_BUNDLE_SCRIPT", REPO / "scripts" / "bundle"))
CTEST = os.environ.get("CTEST", "ctest")
BUDGET_BYTES = 64 * 1024 * 1024
TIME_SCALE = float(os.environ.get("STASH_TEST_TIME_SCALE", "1"))

# Provided by the target machine: glibc, the NVIDIA driver, the kernel's vdso.
SYSTEM = re.compile(
    r"^(lib(c|m|pthread|dl|rt|resolv|util|anl)\.so\.|libnss_|ld-linux|ld64\.so|"
    r"libcuda\.so|libnvidia-|linux-vdso\.so|linux-gate\.so)")
# Libraries the target machine does not have: any of these from the system is a failure, even
# if the generic check below were to miss it.
MUST_BE_BUNDLED = re.compile(
    r"^lib(grpc|gpr|upb|address_sorting|protobuf|absl_|spdlog|fmt|cares|re2|ssl|crypto|z\.|"
    r"cudart)")
# The C++ runtime: shipped in lib/fallback/, on no RUNPATH, so run directly a binary loads the
# node's (this machine's: Debian 12's GCC 12 runtime has every version the bundle needs); ./run
# puts lib/fallback/ first on LD_LIBRARY_PATH where the node's lacks one (test_runtime.py).
RUNTIME = {"libstdc++.so.6", "libgcc_s.so.1"}


def build_dir():
    d = os.environ.get("STASHD_BIN_DIR")
    if not d:
        pytest.fail("STASHD_BIN_DIR is not set: run the test through ctest "
                    "(ctest --test-dir build/release -L bundle)")
    return Path(d)


def run_bundle(out, build=None, check=True):
    result = subprocess.run([str(SCRIPT), str(build or build_dir()), str(out)],
                            capture_output=True, text=True, timeout=240 * TIME_SCALE,
                            env=dict(os.environ, CTEST=CTEST))
    if check:
        assert result.returncode == 0, f"scripts/bundle failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not installed (./scripts/deps installs it)")
    out = tmp_path_factory.mktemp("bundle") / "stashd-bundle"
    result = run_bundle(out)
    print(result.stdout, result.stderr)
    return out


def is_elf(path):
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def elves(root):
    return sorted(p for p in root.rglob("*") if is_elf(p))


def dynamic(path):
    """(NEEDED names, RPATH or None, RUNPATH or None) from `readelf -d`."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out)
    rpath = re.search(r"\(RPATH\)\s+Library rpath: \[(.*)\]", out)
    runpath = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", out)
    return needed, rpath and rpath.group(1), runpath and runpath.group(1)


def ldd(path):
    """{name: resolved path or None} for every `name => ...` line of ldd, with no
    LD_LIBRARY_PATH."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            found[m.group(1)] = m.group(3)
    return found


def check_resolves_inside(root, files=None):
    """Every library ldd finds for `files` (default: every ELF under root) is under root,
    glibc's and the driver's aside; the C++ runtime is the node's (lib/fallback/ is on no
    RUNPATH)."""
    root = root.resolve()
    problems = []
    for elf in files or elves(root):
        for name, where in ldd(elf).items():
            rel = elf.relative_to(root)
            if SYSTEM.match(name):
                if where is None and not name.startswith(("libcuda.so", "libnvidia-")):
                    problems.append(f"{rel}: system library {name} not found")
                continue
            if name in RUNTIME:
                if where is None:
                    problems.append(f"{rel}: {name} not found (this machine has one)")
                elif rel.parts[:2] != ("lib", "fallback") and \
                        root in Path(os.path.realpath(where)).parents:
                    problems.append(f"{rel}: {name} resolves inside the bundle ({where}) with no "
                                    "LD_LIBRARY_PATH: lib/fallback/ must be on no RUNPATH")
                continue
            if where is None:
                problems.append(f"{rel}: {name} not found")
                continue
            real = Path(os.path.realpath(where))
            if root not in real.parents:
                problems.append(f"{rel}: {name} resolves outside the bundle, to {where}")
            if MUST_BE_BUNDLED.match(name) and re.match(r"^/(usr/)?(local/)?lib", where):
                problems.append(f"{rel}: {name} comes from the system ({where})")
    assert not problems, "\n".join(problems)


def run_empty_env(argv, **kwargs):
    """Runs argv with an empty environment (env -i): no PATH, no LD_LIBRARY_PATH."""
    return subprocess.run(["env", "-i", *map(str, argv)], capture_output=True, text=True,
                          timeout=60 * TIME_SCALE, **kwargs)


# ---- Layout ----------------------------------------------------------------------------------


def test_layout(bundle):
    for name in ("stashd", "stashctl"):
        assert is_elf(bundle / "bin" / name), f"bin/{name} is missing"
    assert is_elf((bundle / "lib" / "libstash_client.so").resolve())
    assert os.access(bundle / "run", os.X_OK), "the launcher ./run is missing or not executable"
    assert {p.name for p in (bundle / "lib" / "fallback").iterdir()} == RUNTIME
    assert (bundle / "python" / "stashd" / "__init__.py").is_file()
    assert (bundle / "README").is_file()
    assert 3 <= len((bundle / "README").read_text().splitlines()) <= 10
    assert not list(bundle.rglob("__pycache__"))
    if (REPO / "tests" / "gpu" / "check.sh").exists():
        assert os.access(bundle / "check.sh", os.X_OK), "check.sh is missing or not executable"
    assert not [p for p in (bundle / "bin").iterdir() if p.name.endswith("_test")], \
        "gtest binaries belong in tests/, and only the gpu ones"


def test_every_stash_executable_of_the_build_tree_is_in_bin(bundle):
    build = build_dir()
    wanted = set()
    for p in build.rglob("stash*"):
        if "CMakeFiles" in p.parts or p.name.endswith("_test") or ".so" in p.name:
            continue
        if is_elf(p) and os.access(p, os.X_OK):
            wanted.add(p.name)
    assert {"stashd", "stashctl"} <= wanted
    assert wanted == {p.name for p in (bundle / "bin").iterdir()}


def test_gpu_tests_are_in_tests(bundle):
    shown = subprocess.run([CTEST, "--test-dir", str(build_dir()), "-L", "gpu",
                            "--show-only=json-v1"], capture_output=True, text=True, check=True)
    wanted = {Path(t["command"][0]).name for t in json.loads(shown.stdout).get("tests", [])
              if t.get("command")}
    assert wanted == {p.name for p in (bundle / "tests").iterdir()}
    for name in wanted:
        assert is_elf(bundle / "tests" / name)


def test_manifest_lists_every_file_with_size_and_sha256(bundle):
    listed = {}
    for line in (bundle / "MANIFEST").read_text().splitlines():
        if " -> " in line:
            path, target = line.split(" -> ")
            assert os.readlink(bundle / path) == target
            listed[path] = None
            continue
        path, size, digest = line.split(" ")
        data = (bundle / path).read_bytes()
        assert len(data) == int(size), path
        assert hashlib.sha256(data).hexdigest() == digest, path
        listed[path] = size
    present = {str(p.relative_to(bundle)) for p in bundle.rglob("*")
               if p.is_file() or p.is_symlink()}
    assert present - {"MANIFEST"} == set(listed)


# ---- Size, RUNPATH, libraries -----------------------------------------------------------------


def test_under_the_size_budget(bundle):
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())
    assert total < BUDGET_BYTES, f"{total / 2**20:.1f} MiB"


def test_deploy_readme_states_the_size_it_has(bundle):
    """deploy/README.md's "(about N MiB today)" is within 10% of the bundle this build makes."""
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())
    text = " ".join((REPO / "deploy" / "README.md").read_text(encoding="utf-8").split())
    m = re.search(r"about ([0-9.]+) MiB today", text)
    assert m, "deploy/README.md no longer says the bundle's size"
    stated = float(m.group(1)) * 2**20
    assert abs(stated - total) <= 0.1 * total, (
        f"deploy/README.md says about {m.group(1)} MiB; the bundle is {total / 2**20:.1f} MiB")


def test_every_elf_has_its_runpath(bundle):
    expected = {"bin": "$ORIGIN/../lib", "tests": "$ORIGIN/../lib", "lib": "$ORIGIN"}
    found = elves(bundle)
    assert len(found) > 10
    for elf in found:
        top = elf.relative_to(bundle).parts[0]
        assert top in expected, f"{elf}: an ELF outside bin/, tests/, lib/"
        _, rpath, runpath = dynamic(elf)
        assert runpath == expected[top], f"{elf.relative_to(bundle)}: RUNPATH {runpath}"
        assert rpath is None, f"{elf.relative_to(bundle)}: RPATH {rpath} (RUNPATH expected)"


def test_every_needed_library_is_bundled_or_system(bundle):
    libs = {p.name for p in (bundle / "lib").iterdir() if p.name != "fallback"}
    assert not libs & RUNTIME, "the C++ runtime belongs in lib/fallback/, on no RUNPATH"
    libs |= {p.name for p in (bundle / "lib" / "fallback").iterdir()}
    missing = []
    for elf in elves(bundle):
        needed, _, _ = dynamic(elf)
        missing += [f"{elf.relative_to(bundle)}: {n}" for n in needed
                    if not SYSTEM.match(n) and n not in libs]
    assert not missing, "\n".join(missing)
    # The libraries the target machine lacks are all there.
    for prefix in ("libgrpc++", "libprotobuf", "libabsl_", "libspdlog", "libfmt", "libcares",
                   "libre2", "libssl", "libcrypto", "libz.", "libstdc++", "libgcc_s"):
        assert any(n.startswith(prefix) for n in libs), f"no {prefix}* in lib/"
    assert not [n for n in libs if SYSTEM.match(n)], "a system library was bundled"


def test_every_library_resolves_inside_the_bundle(bundle):
    check_resolves_inside(bundle)


# ---- The oldest machine it runs on -------------------------------------------------------------

# The oldest glibc of the usual GPU node OSes the bundle should run on: RHEL 8 / Rocky 8 (2.28);
# Ubuntu 22.04 and DGX OS 6 have 2.35, RHEL 9 2.34.
TARGET_GLIBC = (2, 28)


def glibc_needed(path):
    """The highest GLIBC_x.y version `objdump -T` lists for an ELF, as a tuple; (0,) for none."""
    out = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True,
                         check=True).stdout
    versions = [tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out)]
    return max(versions, default=(0,))


def test_requires_names_the_highest_glibc_any_shipped_elf_needs(bundle):
    # glibc: over every shipped ELF but lib/fallback/ (what the bundle needs with the node's C++
    # runtime); glibc-fallback: over all of them (with lib/fallback/'s). The rest of REQUIRES:
    # test_runtime.py.
    needs = {elf.relative_to(bundle): glibc_needed(elf) for elf in elves(bundle)}
    node = max(v for p, v in needs.items() if p.parts[:2] != ("lib", "fallback"))
    lines = dict(line.split(" ", 1) for line in (bundle / "REQUIRES").read_text().splitlines())
    assert tuple(int(x) for x in lines["glibc"].split(".")) == node, lines
    assert tuple(int(x) for x in lines["glibc-fallback"].split(".")) == max(needs.values()), lines
    if any(p.name.startswith("libcudart.so.13") for p in (bundle / "lib").iterdir()):
        assert lines.get("driver") == "580", lines


# The bundle is built on Debian 12 (glibc 2.36): everything linked there binds glibc 2.34+
# symbols (__libc_start_main@GLIBC_2.34 in every executable, pthread_*@GLIBC_2.34 in Debian's
# libstdc++, libgcc_s, protobuf, abseil; test_runtime.py holds all but lib/fallback/ to 2.34), so static libstdc++/libgcc alone cannot bring it down
# to 2.28: it needs a build on a glibc 2.28 base with gRPC, protobuf and abseil built there too
# (not done yet; docs/cuda-backend.md). strict: once the bundle meets the target this xfail
# turns into a failure, and the mark must go.
@pytest.mark.xfail(strict=True, reason="bundle built on Debian 12 needs glibc 2.34+ "
                   "(see docs/cuda-backend.md, review fixes item 3)")
def test_every_shipped_elf_runs_on_glibc_2_28(bundle):
    too_new = sorted(f"{elf.relative_to(bundle)}: GLIBC_{'.'.join(map(str, v))}"
                     for elf in elves(bundle) if (v := glibc_needed(elf)) > TARGET_GLIBC)
    assert not too_new, "needs a glibc newer than 2.28:\n" + "\n".join(too_new)


def test_check_sh_prints_glibc_and_driver_first_and_stops_on_an_older_machine(tmp_path):
    # A bundle-shaped folder whose REQUIRES asks for a glibc no machine has: check.sh must say
    # what it found and what to change, and stop before any step.
    root = tmp_path / "bundle"
    (root / "bin").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "gpu" / "check.sh", root / "check.sh")
    (root / "REQUIRES").write_text("glibc 99.0\ndriver 580\n")
    run = subprocess.run(["bash", str(root / "check.sh")], capture_output=True, text=True,
                         timeout=60 * TIME_SCALE, env=dict(os.environ, OUT=str(tmp_path / "out")))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ldd --version:" in run.stdout and "NVIDIA driver:" in run.stdout, run.stdout
    assert "older than 99.0" in run.stdout, run.stdout
    assert "== " not in run.stdout, "a step ran: " + run.stdout
    assert "older than 99.0" in (tmp_path / "out" / "summary.txt").read_text()


# Roots made with the distributions' own tools (debootstrap), named in STASH_PREFLIGHT_ROOTS
# (space-separated; e.g. made by `tests/bundle/preflight_root.sh --make bookworm /srv/roots/12
# --make bullseye /srv/roots/11 ...`): the bundle's check.sh under chroot in each must run to its
# GPU lookup where the root's glibc is new enough, and stop at the glibc preflight where it is
# not. Needs root (chroot, mounting /proc).
@pytest.mark.skipif(not os.environ.get("STASH_PREFLIGHT_ROOTS"),
                    reason="STASH_PREFLIGHT_ROOTS names no debootstrapped roots")
def test_check_sh_on_other_roots_runs_to_the_gpu_lookup_or_stops_at_glibc(bundle):
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    run = subprocess.run([str(REPO / "tests" / "bundle" / "preflight_root.sh"), str(bundle),
                          *os.environ["STASH_PREFLIGHT_ROOTS"].split()],
                         capture_output=True, text=True, timeout=300 * TIME_SCALE)
    assert run.returncode == 0, run.stdout + run.stderr


# ---- Running from the bundle ------------------------------------------------------------------


def test_binaries_run_with_an_empty_environment(bundle):
    version = run_empty_env([bundle / "bin" / "stashd", "--version"])
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("stashd ")
    help_ = run_empty_env([bundle / "bin" / "stashctl", "--help"])
    assert help_.returncode == 0, help_.stderr
    assert "stashctl" in help_.stdout


def serve_and_use(root, tmp_path, launcher=False):
    """Starts the bundled stashd (empty environment, host backend) and runs stashctl, the demo
    and the Python package from the bundle against it; with `launcher`, stashd, the demo and
    python3 start through ./run."""
    sock = tmp_path / "s.sock"
    via = [str(root / "run")] if launcher else []
    daemon = subprocess.Popen(
        ["env", "-i", *via, str(root / "bin" / "stashd"), f"--socket={sock}", "--backend=host",
         "--devices=2", "--pool-bytes=64MiB", "--host-tier-bytes=64MiB", "--log-level=warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20 * TIME_SCALE
        while True:
            health = run_empty_env([root / "bin" / "stashctl", "health", f"--socket={sock}"])
            if health.returncode == 0:
                break
            assert daemon.poll() is None, f"stashd exited: {daemon.stdout.read()}"
            assert time.monotonic() < deadline, f"stashd never served: {health.stdout}"
            time.sleep(0.1)
        if (root / "bin" / "stash-demo").exists():  # STASH_BUILD_EXAMPLES=OFF builds none
            demo = run_empty_env([*via, root / "bin" / "stash-demo", f"--socket={sock}", "--ranks=2",
                                  "--devices=2", "--layers=2", "--steps=1"])
            assert demo.returncode == 0, demo.stdout + demo.stderr
        python = run_empty_env([
            f"PYTHONPATH={root / 'python'}",
            f"STASHD_CLIENT_LIB={root / 'lib' / 'libstash_client.so'}",
            *via, "/usr/bin/python3", "-c",
            "import sys, stashd\n"
            "with stashd.connect(socket=sys.argv[1], rank=0, label='bundle') as c:\n"
            "    c.stats()\n"
            "print('python ok')\n", str(sock)])
        assert python.returncode == 0, python.stdout + python.stderr
        assert "python ok" in python.stdout
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30 * TIME_SCALE)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, daemon.stdout.read()


def test_daemon_demo_and_python_work_from_the_bundle(bundle, tmp_path):
    serve_and_use(bundle, tmp_path)


def test_still_works_after_the_folder_is_moved(bundle, tmp_path):
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(str(bundle), str(moved))
    try:
        version = run_empty_env([moved / "bin" / "stashd", "--version"])
        assert version.returncode == 0, version.stderr
        runtime = run_empty_env([moved / "run", "--runtime"])
        assert runtime.returncode == 0 and runtime.stdout.startswith("node: "), runtime
        # The executables' closures (ldd walks them whole) and the client library's.
        check_resolves_inside(moved, [p for p in elves(moved) if p.parent.name != "lib"] +
                              [(moved / "lib" / "libstash_client.so").resolve()])
        serve_and_use(moved, tmp_path, launcher=True)
    finally:
        shutil.move(str(moved), str(bundle))


# ---- The script itself ---------------------------------------------------------------------------------


def test_refuses_a_build_tree_without_binaries(tmp_path):
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not installed (./scripts/deps installs it)")
    (tmp_path / "empty-build").mkdir()
    result = run_bundle(tmp_path / "out", build=tmp_path / "empty-build", check=False)
    assert result.returncode == 1
    assert "./scripts/build release" in result.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_to_replace_a_folder_that_is_not_a_bundle(tmp_path):
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not installed (./scripts/deps installs it)")
    keep = tmp_path / "out" / "precious"
    keep.parent.mkdir()
    keep.write_text("x")
    result = run_bundle(tmp_path / "out", check=False)
    assert result.returncode == 1
    assert "not a bundle" in result.stderr
    assert keep.read_text() == "x"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_script_is_shellcheck_clean():
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_launcher_it_writes_is_shellcheck_clean(bundle):
    result = subprocess.run(["shellcheck", str(bundle / "run")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout

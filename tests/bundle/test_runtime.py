"""Which C++ runtime a bundle runs on, and what it needs from the node (issue 42).

Run: ctest --test-dir build/release -R bundle.runtime   (or, by hand,
STASHD_BIN_DIR=build/release /usr/bin/python3 -m pytest -q tests/bundle/test_runtime.py)

scripts/bundle ships libstdc++.so.6 and libgcc_s.so.1 in lib/fallback/, on no RUNPATH, and a
launcher, ./run, that uses the node's own copies where they define every version REQUIRES lists
(every GLIBCXX_/CXXABI_ and GCC_ version a shipped ELF references) and puts lib/fallback/ first on
LD_LIBRARY_PATH where they do not. One fresh bundle serves every case:

- no shipped ELF but the two in lib/fallback/ needs more than GLIBC_2.34 (`objdump -T`), so with
  the node's runtime the bundle runs on glibc 2.34 and newer (RHEL 9, Ubuntu 22.04 and 24.04,
  Debian 12), and REQUIRES says so, and what each case needs;
- against a fake node libstdc++.so.6 (built here with gcc and a version script; found first on
  LD_LIBRARY_PATH, as the loader finds a node's) that defines every version REQUIRES lists, the
  launched program loads that one; against one without GLIBCXX_3.4.30 it loads lib/fallback/'s
  (read from the program's own /proc/self/maps, and from LD_DEBUG=libs for stashd itself);
- where that fallback needs a newer glibc than the machine has (a stand-in `ldd --version`
  saying 2.35, as on Ubuntu 22.04), ./run and check.sh's preflight refuse with what to change,
  and on such a node with a new enough libstdc++ check.sh runs on to its GPU lookup.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(os.environ.get("STASH_BUNDLE_SCRIPT", REPO / "scripts" / "bundle"))
CTEST = os.environ.get("CTEST", "ctest")
TIME_SCALE = float(os.environ.get("STASH_TEST_TIME_SCALE", "1"))

# What the bundle built on Debian 12 must run on with the node's C++ runtime: RHEL 9's glibc.
NODE_RUNTIME_GLIBC = (2, 34)
RUNTIME = {"libstdc++.so.6", "libgcc_s.so.1"}

# Prints the file every mapping of libstdc++.so.6 / libgcc_s.so.1 comes from, and
# LD_LIBRARY_PATH: what the launched program actually loaded and saw.
PROBE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  char line[4096];
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) return 2;
  while (fgets(line, sizeof line, maps)) {
    char *path = strchr(line, '/');
    if (path && (strstr(path, "/libstdc++.so.6") || strstr(path, "/libgcc_s.so.1")))
      printf("maps %s", path);
  }
  const char *p = getenv("LD_LIBRARY_PATH");
  printf("LD_LIBRARY_PATH=%s\n", p ? p : "(unset)");
  return 0;
}
"""


def build_dir():
    d = os.environ.get("STASHD_BIN_DIR")
    if not d:
        pytest.fail("STASHD_BIN_DIR is not set: run the test through ctest "
                    "(ctest --test-dir build/release -L bundle)")
    return Path(d)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if shutil.which("patchelf") is None:
        pytest.fail("patchelf is not installed: run ./scripts/deps (or apt-get install patchelf)")
    out = tmp_path_factory.mktemp("runtime") / "stashd-bundle"
    result = subprocess.run([str(SCRIPT), str(build_dir()), str(out)], capture_output=True,
                            text=True, timeout=300 * TIME_SCALE, env=dict(os.environ, CTEST=CTEST))
    assert result.returncode == 0, f"scripts/bundle failed:\n{result.stdout}\n{result.stderr}"
    print(result.stdout)
    return out


def requires(bundle):
    """REQUIRES as {key: value}."""
    return dict(line.split(" ", 1) for line in (bundle / "REQUIRES").read_text().splitlines())


def is_elf(path):
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def shipped_elves(bundle):
    """Every ELF of the bundle but the fallback runtime."""
    return sorted(p for p in bundle.rglob("*")
                  if is_elf(p) and p.relative_to(bundle).parts[:2] != ("lib", "fallback"))


def objdump_t(path):
    return subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True,
                          check=True).stdout


def version_key(v):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[._]", v))


def glibc_of(symbols):
    return max((tuple(int(x) for x in v.split(".")) for v in
                re.findall(r"GLIBC_(\d+(?:\.\d+)+)", symbols)), default=(0,))


def dotted(v):
    return ".".join(map(str, v))


# ---- What the bundle needs -----------------------------------------------------------------


def test_no_shipped_elf_but_the_fallback_runtime_needs_more_than_glibc_2_34(bundle):
    assert {p.name for p in (bundle / "lib" / "fallback").iterdir()} == RUNTIME
    elves = shipped_elves(bundle)
    assert len(elves) > 10
    too_new = sorted(f"{elf.relative_to(bundle)}: GLIBC_{dotted(v)}" for elf in elves
                     if (v := glibc_of(objdump_t(elf))) > NODE_RUNTIME_GLIBC)
    assert not too_new, ("needs more than glibc 2.34 (RHEL 9) with the node's C++ runtime:\n"
                         + "\n".join(too_new))


def test_requires_states_what_each_runtime_needs(bundle):
    lines = requires(bundle)
    elves = shipped_elves(bundle)
    symbols = {elf: objdump_t(elf) for elf in elves}
    node = max(glibc_of(s) for s in symbols.values())
    everything = max(node, *(glibc_of(objdump_t(p)) for p in (bundle / "lib" / "fallback").iterdir()))
    assert lines["glibc"] == dotted(node), lines
    assert lines["glibc-fallback"] == dotted(everything), lines
    # Every version the shipped ELFs reference (their *UND* symbols), per library.
    referenced = set()
    for s in symbols.values():
        for row in s.splitlines():
            if "*UND*" in row:
                referenced |= set(re.findall(r"\b((?:GLIBCXX|CXXABI|GCC)_[0-9A-Za-z_.]+)", row))
    stdcxx = sorted((v for v in referenced if v.startswith(("GLIBCXX_", "CXXABI_"))), key=version_key)
    gcc = sorted((v for v in referenced if v.startswith("GCC_")), key=version_key)
    assert lines["libstdc++.so.6"].split() == stdcxx, lines
    assert lines["libgcc_s.so.1"].split() == gcc, lines
    newest = max((v for v in stdcxx if v.startswith("GLIBCXX_")), key=version_key)
    assert lines["glibcxx"] == newest.removeprefix("GLIBCXX_"), lines
    # The same as what the loader checks: the version needs (objdump -p) on each library.
    needed = {"libstdc++.so.6": set(), "libgcc_s.so.1": set()}
    for elf in elves:
        current = None
        for row in subprocess.run(["objdump", "-p", str(elf)], capture_output=True, text=True,
                                  check=True).stdout.splitlines():
            m = re.match(r"\s*required from (\S+):", row)
            if m:
                current = m.group(1)
            elif current in needed and (m := re.match(r"\s+0x[0-9a-f]+ 0x\d+ \d+ (\S+)", row)):
                needed[current].add(m.group(1))
    assert needed["libstdc++.so.6"] == set(stdcxx)
    assert needed["libgcc_s.so.1"] == set(gcc)
    # This build needs GCC 12's libstdc++ (condition_variable::wait@GLIBCXX_3.4.30), and the
    # fallback (Debian 12's) needs glibc 2.36: the two cases differ, as issue 42 says.
    assert lines["glibcxx"] == "3.4.30" and lines["glibc-fallback"] == "2.36", lines


# ---- Which runtime ./run picks and the program loads -----------------------------------------


def fake_libstdcxx(directory, versions):
    """A libstdc++.so.6 in `directory` whose only content is one version node per name in
    `versions` (one symbol each: ld keeps a node that has one)."""
    directory.mkdir(parents=True)
    script = "".join(f"{v} {{ global: stash_fake_{i}; }};\n" for i, v in enumerate(versions))
    source = "".join(f"int stash_fake_{i} = {i};\n" for i in range(len(versions)))
    (directory / "v.map").write_text(script)
    (directory / "fake.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(directory / "libstdc++.so.6"),
                    "-Wl,-soname,libstdc++.so.6", f"-Wl,--version-script={directory / 'v.map'}",
                    str(directory / "fake.c")], check=True, capture_output=True, text=True)
    defined = subprocess.run(["objdump", "-p", str(directory / "libstdc++.so.6")],
                             capture_output=True, text=True, check=True).stdout
    for v in versions:
        assert re.search(rf"\s{re.escape(v)}$", defined, re.M), f"{v} not defined:\n{defined}"
    return directory


@pytest.fixture(scope="module")
def fakes(bundle, tmp_path_factory):
    """(new, old, probe): fake node libstdc++ folders with every version REQUIRES lists and
    with all but GLIBCXX_3.4.30, and the probe program, linked to libstdc++.so.6."""
    root = tmp_path_factory.mktemp("fakes")
    wanted = requires(bundle)["libstdc++.so.6"].split()
    assert "GLIBCXX_3.4.30" in wanted
    new = fake_libstdcxx(root / "new", wanted)
    old = fake_libstdcxx(root / "old", [v for v in wanted if v != "GLIBCXX_3.4.30"])
    (root / "probe.c").write_text(PROBE_C)
    subprocess.run(["gcc", "-o", str(root / "probe"), str(root / "probe.c"), "-Wl,--no-as-needed",
                    str(new / "libstdc++.so.6")], check=True, capture_output=True, text=True)
    needed = subprocess.run(["readelf", "-d", str(root / "probe")], capture_output=True,
                            text=True, check=True).stdout
    assert "[libstdc++.so.6]" in needed, needed
    return new, old, root / "probe"


@pytest.fixture(scope="module")
def glibc235(tmp_path_factory):
    """A folder with a stand-in `ldd` for a glibc 2.35 machine (Ubuntu 22.04), to put first on
    PATH: `ldd --version` says 2.35 (what check.sh and ./run read); anything else is the real
    ldd."""
    d = tmp_path_factory.mktemp("glibc235")
    (d / "ldd").write_text('#!/bin/bash\nif [ "${1:-}" = --version ]; then\n'
                           '  echo "ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35"; exit 0\nfi\n'
                           'exec /usr/bin/ldd "$@"\n')
    (d / "ldd").chmod(0o755)
    return d


def launch(bundle, *argv, ld_path=None, glibc235=None, extra_env=None):
    """Runs ./run ARGV with a clean environment, LD_LIBRARY_PATH=ld_path where given."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    if glibc235:
        env["PATH"] = f"{glibc235}:{env['PATH']}"
    if ld_path:
        env["LD_LIBRARY_PATH"] = str(ld_path)
    env.update(extra_env or {})
    return subprocess.run([str(bundle / "run"), *map(str, argv)], capture_output=True, text=True,
                          timeout=60 * TIME_SCALE, env=env)


def loaded(run):
    """{name: file} from the probe's output."""
    assert run.returncode == 0, run.stdout + run.stderr
    return {Path(line.split()[-1]).name: line.split()[-1]
            for line in run.stdout.splitlines() if line.startswith("maps ")}


def test_a_node_libstdcxx_with_every_version_is_the_one_loaded(bundle, fakes):
    new, _, probe = fakes
    runtime = launch(bundle, "--runtime", ld_path=new)
    assert runtime.returncode == 0, runtime.stdout + runtime.stderr
    assert runtime.stdout.startswith("node: "), runtime.stdout
    assert str(new / "libstdc++.so.6") in runtime.stdout, runtime.stdout
    run = launch(bundle, probe, ld_path=new)
    assert loaded(run)["libstdc++.so.6"] == str(new / "libstdc++.so.6"), run.stdout
    assert f"LD_LIBRARY_PATH={new}\n" in run.stdout, "the launcher changed LD_LIBRARY_PATH"


def test_a_node_libstdcxx_without_glibcxx_3_4_30_gives_way_to_the_fallback(bundle, fakes):
    _, old, probe = fakes
    fallback = (bundle / "lib" / "fallback").resolve()
    runtime = launch(bundle, "--runtime", ld_path=old)
    assert runtime.returncode == 0, runtime.stdout + runtime.stderr
    assert runtime.stdout.startswith("fallback: "), runtime.stdout
    assert f"{old / 'libstdc++.so.6'}) lacks GLIBCXX_3.4.30" in runtime.stdout, runtime.stdout
    run = launch(bundle, probe, ld_path=old)
    assert loaded(run) == {"libstdc++.so.6": str(fallback / "libstdc++.so.6"),
                           "libgcc_s.so.1": str(fallback / "libgcc_s.so.1")}, run.stdout
    assert f"LD_LIBRARY_PATH={fallback}:{old}\n" in run.stdout, run.stdout
    # stashd itself, on the fallback runtime, by name from bin/.
    stashd = launch(bundle, "stashd", "--version", ld_path=old, extra_env={"LD_DEBUG": "libs"})
    assert stashd.returncode == 0, stashd.stderr[-3000:]
    assert stashd.stdout.startswith("stashd "), stashd.stdout
    inits = re.findall(r"calling init: (\S+/(?:libstdc\+\+\.so\.6|libgcc_s\.so\.1))$",
                       stashd.stderr, re.M)
    assert sorted(inits) == sorted([str(fallback / "libgcc_s.so.1"),
                                    str(fallback / "libstdc++.so.6")]), inits


def test_this_machines_own_runtime_is_used_as_the_node_one(bundle):
    # Debian 12's libstdc++ is GCC 12's (GLIBCXX_3.4.30): stashd through ./run loads it, not
    # lib/fallback/'s (what ldconfig -p lists, as on a node).
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                           check=True).stdout
    m = re.search(r"libstdc\+\+\.so\.6 \(libc6,x86-64\) => (\S+)", cache)
    assert m, cache
    runtime = launch(bundle, "--runtime")
    assert runtime.returncode == 0 and runtime.stdout.startswith("node: "), runtime
    stashd = launch(bundle, "stashd", "--version", extra_env={"LD_DEBUG": "libs"})
    assert stashd.returncode == 0, stashd.stderr[-3000:]
    inits = re.findall(r"calling init: (\S+/libstdc\+\+\.so\.6)$", stashd.stderr, re.M)
    assert [os.path.realpath(p) for p in inits] == [os.path.realpath(m.group(1))], inits


def test_a_launch_from_a_launch_decides_again_without_its_fallback(bundle, fakes):
    # lib/fallback/ on the caller's LD_LIBRARY_PATH (one ./run started another) does not count
    # as the node's runtime, and is not left there when the node's will do.
    new, _, probe = fakes
    fallback = (bundle / "lib" / "fallback").resolve()
    run = launch(bundle, probe, ld_path=f"{fallback}:{new}")
    assert loaded(run)["libstdc++.so.6"] == str(new / "libstdc++.so.6"), run.stdout
    assert f"LD_LIBRARY_PATH={new}\n" in run.stdout, run.stdout


def test_a_glibc_too_old_for_the_fallback_is_refused_with_what_to_change(bundle, fakes,
                                                                         glibc235):
    new, old, probe = fakes
    runtime = launch(bundle, "--runtime", ld_path=old, glibc235=glibc235)
    assert runtime.returncode == 1, runtime.stdout + runtime.stderr
    assert runtime.stdout.startswith("fallback: "), runtime.stdout
    assert "glibc 2.35 is older than 2.36" in runtime.stderr, runtime.stderr
    assert "GCC 12's libstdc++" in runtime.stderr, runtime.stderr
    refused = launch(bundle, "stashd", "--version", ld_path=old, glibc235=glibc235)
    assert refused.returncode == 126, refused.stdout + refused.stderr
    assert "cannot run" in refused.stderr and "older than 2.36" in refused.stderr, refused.stderr
    # The same machine with a new enough libstdc++: the node's runtime, glibc 2.34 is enough.
    fine = launch(bundle, probe, ld_path=new, glibc235=glibc235)
    assert loaded(fine)["libstdc++.so.6"] == str(new / "libstdc++.so.6"), fine.stdout


def test_the_launcher_refuses_bad_input_clearly(bundle):
    none = launch(bundle)
    assert none.returncode == 2 and "usage: ./run PROGRAM" in none.stderr, none
    unknown = launch(bundle, "--bogus")
    assert unknown.returncode == 2 and "unknown option --bogus" in unknown.stderr, unknown
    missing = launch(bundle, "no-such-program")
    assert missing.returncode == 127, missing
    assert "neither bin/ nor tests/" in missing.stderr and "stashd" in missing.stderr, missing


# ---- check.sh's preflight on the real bundle ---------------------------------------------------


def check_sh(bundle, tmp_path, ld_path=None, glibc235=None):
    """The bundle's check.sh with no nvidia-smi on PATH: it stops at the preflight or at its GPU
    lookup."""
    path = [d for d in os.environ["PATH"].split(":")
            if d and not (Path(d) / "nvidia-smi").exists()]
    env = {"PATH": ":".join(([str(glibc235)] if glibc235 else []) + path),
           "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    if ld_path:
        env["LD_LIBRARY_PATH"] = str(ld_path)
    run = subprocess.run(["bash", str(bundle / "check.sh")], capture_output=True, text=True,
                         timeout=120 * TIME_SCALE, env=env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "\n== " not in run.stdout, "a step ran: " + run.stdout
    return run.stdout


def test_check_sh_runs_on_a_glibc_2_35_node_with_its_own_gcc_12_runtime(bundle, glibc235,
                                                                         tmp_path):
    out = check_sh(bundle, tmp_path, glibc235=glibc235)
    assert "needs: glibc >= 2.34 (2.36 with the bundle's C++ runtime" in out, out
    assert "C++ runtime (./run --runtime): node: " in out, out
    assert "binaries load: stashd " in out, out
    assert "no GPU found" in out, out


def test_check_sh_stops_on_a_glibc_2_35_node_whose_libstdcxx_is_too_old(bundle, fakes,
                                                                         glibc235, tmp_path):
    _, old, _ = fakes
    out = check_sh(bundle, tmp_path, ld_path=old, glibc235=glibc235)
    assert "C++ runtime (./run --runtime): fallback: " in out, out
    assert ("glibc 2.35 is older than 2.36, which the bundle's own C++ runtime (lib/fallback/) "
            "needs") in out, out
    assert "lacks GLIBCXX_3.4.30" in out and "GCC 12's libstdc++" in out, out
    assert "binaries load" not in out, out
    assert "older than 2.36" in (tmp_path / "out" / "summary.txt").read_text()


def test_check_sh_runs_on_the_fallback_where_glibc_is_new_enough(bundle, fakes, tmp_path):
    _, old, _ = fakes
    out = check_sh(bundle, tmp_path, ld_path=old)
    assert "C++ runtime (./run --runtime): fallback: " in out, out
    assert "binaries load: stashd " in out, out
    assert "no GPU found" in out, out


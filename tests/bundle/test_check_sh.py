"""check.sh's preflight and GPU choice, without a GPU: fake `nvidia-smi` commands and a fake
bundle whose binaries only write down what they saw.

Run: ctest --test-dir build/release -R gpu_check   (or /usr/bin/python3 -m pytest -q
tests/bundle/test_check_sh.py). Needs bash and coreutils only.
"""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tests" / "gpu" / "check.sh"
UUID = "GPU-11111111-2222-3333-4444-555555555555"

# One fake for every binary of the bundle: writes "<name> <CUDA_VISIBLE_DEVICES> <args>" to
# $FAKE_LOG and "<name> <LD_LIBRARY_PATH>" to $FAKE_LOG.ld; answers --help and --version; stashd sleeps until check.sh stops it; the
# benchmarks write a JSON whose first size did not verify while the summary did (with
# $FAKE_PEER_SKIP set, `peer` writes a skipped one with that reason).
FAKE_BINARY = r"""#!/bin/bash
name="$(basename "$0")"
echo "$name ${CUDA_VISIBLE_DEVICES:-unset} $*" >>"$FAKE_LOG"
echo "$name ${LD_LIBRARY_PATH:-unset}" >>"$FAKE_LOG.ld"
case "${1:-}" in
  --help) echo "usage"; exit 0 ;;
  --version) echo "stashd 9.9.9"; exit 0 ;;
esac
case "$name" in
  stashd) exec sleep 60 ;;
  stash-bench-gpu | stash-bench-request)
    for a in "$@"; do case "$a" in --json=*) json="${a#--json=}" ;; esac; done
    if [ "$1" = peer ] && [ -n "${FAKE_PEER_SKIP:-}" ]; then
      printf '{\n  "bench": "peer",\n  "skipped": true,\n  "summary": {"skipped": true, "reason": "%s"},\n  "ok": true\n}\n' "$FAKE_PEER_SKIP" >"$json"
      exit 0
    fi
    cat >"$json" <<'EOF'
{
  "sizes": [{"size_mib": 1, "verified": false}, {"size_mib": 64, "verified": true}],
  "summary": {"stash_ratio_min_from_64mib": 0.95, "verified": true},
  "ok": true
}
EOF
    exit 0 ;;
  *_test) echo "[  PASSED  ] 3 tests."; exit 0 ;;
esac
exit 0
"""


def fake_nvidia_smi(compute_mode="Default", mig="[N/A]", free_mib=80000, gpus=2,
                    knows_mig=True, others_free_mib=None):
    """GPUs 0 to gpus - 1, all alike; others_free_mib: the free memory of every GPU but 0."""
    others = free_mib if others_free_mib is None else others_free_mib
    lines = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {UUID[:-1]}{i})" for i in range(gpus))
    old_driver = "" if knows_mig else """
  *mig.mode.current*) echo 'Field "mig.mode.current" is not a valid field to query.'; exit 2 ;;
  "-i "*)
    echo "index, uuid, name, driver_version, memory.total [MiB], memory.used [MiB], memory.free [MiB], compute_mode"
    echo "$2, """ + UUID[:-1] + f"""$2, NVIDIA H100 80GB HBM3, 470.1, 81559 MiB, 1 MiB, {free_mib} MiB, {compute_mode}" ;;"""
    return f"""#!/bin/bash
case "$*" in
  -L) printf '%s\\n' "{lines}" ;;
  *--query-gpu=driver_version*) echo "580.65.06" ;;{old_driver}
  "-i "*)
    index="$2"
    if [ "$index" -ge {gpus} ]; then echo "No devices were found"; exit 6; fi
    echo "index, uuid, name, driver_version, memory.total [MiB], memory.used [MiB], memory.free [MiB], compute_mode, mig.mode.current"
    free={free_mib}; if [ "$index" != 0 ]; then free={others}; fi
    echo "$index, {UUID[:-1]}$index, NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 1 MiB, $free MiB, {compute_mode}, {mig}" ;;
  *) exit 1 ;;
esac
"""


def write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "bundle"
    for d in ("bin", "lib", "tests", "python"):
        (root / d).mkdir(parents=True)
    for name in ("stashd", "stashctl", "stash-demo", "stash-bench-gpu", "stash-bench-request"):
        write_exe(root / "bin" / name, FAKE_BINARY)
    write_exe(root / "tests" / "paging_gpu_test", FAKE_BINARY)
    shutil.copy(CHECK, root / "check.sh")
    (root / "torch_cuda_check.py").write_text("import sys\nsys.exit(2)\n")
    (root / "REQUIRES").write_text("glibc 2.0\ndriver 580\n")
    return root


def run_check(tmp_path, bundle, smi=None, glibc=None, **env):
    """check.sh of `bundle` with the fake nvidia-smi `smi` (none: no nvidia-smi) and, with
    `glibc` ("2.35"), an `ldd --version` that says so."""
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir(exist_ok=True)
    if smi is not None:
        write_exe(fake_bin / "nvidia-smi", smi)
    if glibc is not None:
        write_exe(fake_bin / "ldd", f"""#!/bin/bash
if [ "${{1:-}}" = --version ]; then echo "ldd (Fake GLIBC {glibc}) {glibc}"; exit 0; fi
exec /usr/bin/ldd "$@"
""")
    # PATH without the machine's own nvidia-smi, if it has one.
    path = [str(fake_bin)] + [d for d in os.environ["PATH"].split(":")
                              if d and not (Path(d) / "nvidia-smi").exists()]
    full_env = dict(os.environ, PATH=":".join(path), OUT=str(tmp_path / "out"),
                    FAKE_LOG=str(tmp_path / "fake.log"), **env)
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    full_env.pop("LD_LIBRARY_PATH", None)
    if "STASH_CHECK_GPU" not in env:
        full_env.pop("STASH_CHECK_GPU", None)
    run = subprocess.run(["bash", str(bundle / "check.sh")], capture_output=True, text=True,
                         timeout=120, env=full_env)
    log = (tmp_path / "fake.log").read_text() if (tmp_path / "fake.log").exists() else ""
    return run, log


def assert_stopped(tmp_path, run, *phrases):
    assert run.returncode == 1, run.stdout + run.stderr
    assert "== " not in run.stdout, "a step ran: " + run.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for phrase in phrases:
        assert phrase in run.stdout, run.stdout
        assert phrase in summary, summary


def test_without_nvidia_smi_it_runs_the_preflight_and_stops_where_it_looks_for_a_gpu(
        tmp_path, bundle):
    run, log = run_check(tmp_path, bundle)
    assert "ldd --version:" in run.stdout and "NVIDIA driver: none found" in run.stdout
    assert "binaries load: stashd 9.9.9" in run.stdout, run.stdout
    assert_stopped(tmp_path, run, "no GPU found: nvidia-smi is not installed")
    # Only the preflight's --help and --version ran.
    assert all(("--help" in line or "--version" in line) for line in log.splitlines()), log


def test_a_driver_without_gpus_stops_with_no_gpu_found(tmp_path, bundle):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(gpus=0))
    assert_stopped(tmp_path, run, "no GPU found: nvidia-smi -L lists none")


@pytest.mark.parametrize("mode", ["Exclusive_Process", "Prohibited"])
def test_a_gpu_two_processes_cannot_share_stops_the_check(tmp_path, bundle, mode):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(compute_mode=mode))
    assert_stopped(tmp_path, run, f"compute mode {mode}", "STASH_CHECK_GPU")
    assert "sleep" not in log and "stash-demo" not in log, log


def test_mig_and_a_nearly_full_gpu_stop_the_check(tmp_path, bundle):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(mig="Enabled"))
    assert_stopped(tmp_path, run, "MIG enabled")
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(free_mib=2000))
    assert_stopped(tmp_path, run, "2000 MiB free", "6144 MiB")


@pytest.mark.parametrize("value, phrase", [("x", "is not a GPU index"),
                                           ("7", "nvidia-smi has no GPU 7 (it lists 2")])
def test_a_bad_stash_check_gpu_is_refused(tmp_path, bundle, value, phrase):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), STASH_CHECK_GPU=value)
    assert_stopped(tmp_path, run, phrase)


def test_a_driver_that_does_not_know_mig_is_asked_again_without_it(tmp_path, bundle):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(knows_mig=False,
                                                             compute_mode="Exclusive_Process"))
    assert_stopped(tmp_path, run, "compute mode Exclusive_Process")


def test_every_step_sees_only_the_chosen_gpu(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), STASH_CHECK_GPU="1")
    assert "compute mode Default" in run.stdout, run.stdout
    chosen = UUID[:-1] + "1"
    step_lines = [line for line in log.splitlines()
                  if "--help" not in line and "--version" not in line]
    names = {line.split()[0] for line in step_lines}
    assert {"paging_gpu_test", "stashd", "stash-demo", "stash-bench-gpu",
            "stash-bench-request"} <= names, log
    for line in step_lines:
        assert line.split()[1] == chosen, line
    # GPU 1 is the last of two: the peer step has no second GPU and skips.
    assert "== bench peer: skip (needs a second GPU" in run.stdout, run.stdout
    # Every gtest and the demo ran with lazy and with eager module loading.
    assert "== paging_gpu_test-eager: pass" in run.stdout, run.stdout
    assert "== stash-demo-eager: pass" in run.stdout, run.stdout
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_copy_row_reads_verified_from_the_summary_not_the_first_size(tmp_path, bundle):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi())
    row = next(line for line in run.stdout.splitlines() if line.startswith("== bench copy:"))
    assert "verified true" in row, row
    assert "stash 0.95x" in row, row


def test_only_the_peer_step_sees_a_second_gpu_the_next_one_by_default(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(gpus=3))
    assert run.returncode == 0, run.stdout + run.stderr
    first, second = UUID[:-1] + "0", UUID[:-1] + "1"
    step_lines = [line for line in log.splitlines()
                  if "--help" not in line and "--version" not in line]
    peer = [line for line in step_lines if line.split()[:3:2] == ["stash-bench-gpu", "peer"]]
    assert len(peer) == 1, log
    assert peer[0].split()[1] == f"{first},{second}", peer[0]
    for line in step_lines:
        if line not in peer:
            assert line.split()[1] == first, line
    assert "== bench peer: pass" in run.stdout, run.stdout
    assert "== bench mapped-overlap: pass" in run.stdout, run.stdout
    assert f"stash-bench-gpu {first} mapped-overlap" in log, log


def test_stash_check_peer_gpu_picks_the_peer(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(gpus=3), STASH_CHECK_PEER_GPU="2")
    assert f"{UUID[:-1]}0,{UUID[:-1]}2 peer" in log, log
    assert "== bench peer: pass" in run.stdout, run.stdout


@pytest.mark.parametrize("value, row", [
    ("0", "== bench peer: skip (STASH_CHECK_PEER_GPU=0 is the check's own GPU"),
    ("5", "== bench peer: skip (needs a second GPU: nvidia-smi lists 2, none is GPU 5"),
    ("x", "== bench peer: fail (STASH_CHECK_PEER_GPU=x is not a GPU index"),
])
def test_a_peer_gpu_that_cannot_be_used_skips_or_fails_only_that_step(tmp_path, bundle, value,
                                                                        row):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), STASH_CHECK_PEER_GPU=value)
    assert row in run.stdout, run.stdout
    assert " peer " not in log, log
    assert "== bench mapped-overlap: pass" in run.stdout, run.stdout
    assert run.returncode == (1 if value == "x" else 0), run.stdout


def test_with_one_gpu_the_peer_step_skips_and_the_check_passes(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(gpus=1))
    assert "== bench peer: skip (needs a second GPU: nvidia-smi lists 1" in run.stdout, run.stdout
    assert " peer " not in log, log
    assert run.returncode == 0, run.stdout + run.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert any(line.startswith("bench peer") and "| skip" in line
               for line in summary.splitlines()), summary


def test_a_busy_peer_gpu_is_skipped(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(others_free_mib=1000))
    assert "== bench peer: skip (peer GPU 1 has 1000 MiB free" in run.stdout, run.stdout
    assert " peer " not in log, log


def test_a_peer_benchmark_that_skips_gives_a_skip_row_with_its_reason(tmp_path, bundle):
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(),
                       FAKE_PEER_SKIP="cuDeviceCanAccessPeer says device 0 cannot access device 1")
    assert ("== bench peer: skip (cuDeviceCanAccessPeer says device 0 cannot access device 1)"
            in run.stdout), run.stdout
    assert run.returncode == 0, run.stdout + run.stderr


def test_stash_check_steps_runs_only_the_steps_it_names(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(),
                         STASH_CHECK_STEPS="bench_copy, gtests")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "steps (STASH_CHECK_STEPS): gtests bench_copy" in run.stdout, run.stdout
    step_lines = [line for line in log.splitlines()
                  if "--help" not in line and "--version" not in line]
    assert {line.split()[0] for line in step_lines} == {"paging_gpu_test", "stash-bench-gpu"}, log
    assert [line.split()[2] for line in step_lines if line.startswith("stash-bench-gpu")] == \
        ["copy"], log
    rows = [line for line in run.stdout.splitlines()
            if line.startswith("== ") and not line.startswith("== summary")]
    assert [row.split(":")[0] for row in rows] == [
        "== nvidia-smi", "== paging_gpu_test", "== paging_gpu_test-eager", "== bench copy"], rows


def test_a_stash_check_steps_name_that_is_no_step_stops_before_any_step(tmp_path, bundle):
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), STASH_CHECK_STEPS="gtests,copy")
    assert_stopped(tmp_path, run, 'STASH_CHECK_STEPS names "copy", which is not a step',
                   "bench_copy")
    assert all(("--help" in line or "--version" in line) for line in log.splitlines()), log


# ---- The C++ runtime: ./run --runtime picks it, REQUIRES says what each choice needs ------------

# A bundle's REQUIRES (scripts/bundle on Debian 12): glibc 2.34 with the node's libstdc++ and
# libgcc_s, 2.36 with the bundle's lib/fallback/ ones.
REQUIRES_BOTH = "glibc 2.34\nglibc-fallback 2.36\nglibcxx 3.4.30\ndriver 580\n"
NODE = ("node: the node's libstdc++.so.6 (/usr/lib/x86_64-linux-gnu/libstdc++.so.6), "
        "libgcc_s.so.1 (/usr/lib/x86_64-linux-gnu/libgcc_s.so.1) define every version the bundle "
        "needs; needs glibc 2.34, this machine has 2.35")
FALLBACK = ("fallback: lib/fallback/ (the bundle's libstdc++.so.6 and libgcc_s.so.1) goes first "
            "on LD_LIBRARY_PATH, because the node's libstdc++.so.6 (/usr/lib64/libstdc++.so.6) "
            "lacks GLIBCXX_3.4.30; needs glibc 2.36, this machine has 2.35")


def with_launcher(bundle, answer):
    """A stand-in ./run whose --runtime answers `answer` (the real one: test_runtime.py)."""
    write_exe(bundle / "run", f"""#!/bin/bash
[ "$1" = --runtime ] || exit 99
echo "{answer}"
""")
    (bundle / "REQUIRES").write_text(REQUIRES_BOTH)
    (bundle / "lib" / "fallback").mkdir()


def ld_paths(tmp_path):
    log = tmp_path / "fake.log.ld"
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_glibc_2_35_node_runs_when_its_own_cxx_runtime_will_do(tmp_path, bundle):
    with_launcher(bundle, NODE)
    run, _ = run_check(tmp_path, bundle, glibc="2.35")
    assert "needs: glibc >= 2.34 (2.36 with the bundle's C++ runtime, lib/fallback/)" in run.stdout
    assert "C++ runtime (./run --runtime): node: " in run.stdout, run.stdout
    assert "binaries load: stashd 9.9.9" in run.stdout, run.stdout
    assert_stopped(tmp_path, run, "no GPU found")
    assert ld_paths(tmp_path) and set(ld_paths(tmp_path)) == {"unset"}, ld_paths(tmp_path)


def test_a_glibc_2_35_node_stops_when_only_the_fallback_runtime_would_do(tmp_path, bundle):
    with_launcher(bundle, FALLBACK)
    run, log = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), glibc="2.35")
    assert_stopped(tmp_path, run, "glibc 2.35 is older than 2.36, which the bundle's own C++ "
                   "runtime (lib/fallback/) needs", "the node's libstdc++.so.6 "
                   "(/usr/lib64/libstdc++.so.6) lacks GLIBCXX_3.4.30. Give the node GCC 12's")
    assert "; needs glibc" not in (tmp_path / "out" / "summary.txt").read_text()
    assert log == "", "a binary ran: " + log


def test_the_fallback_runtime_reaches_every_step_where_glibc_is_new_enough(tmp_path, bundle):
    with_launcher(bundle, FALLBACK.replace("this machine has 2.35", "this machine has 2.36"))
    run, _ = run_check(tmp_path, bundle, smi=fake_nvidia_smi(), glibc="2.36")
    assert run.returncode == 0, run.stdout + run.stderr
    paths = ld_paths(tmp_path)
    assert len(paths) > 10, paths
    assert set(paths) == {str(bundle / "lib" / "fallback")}, paths


def test_a_node_older_than_the_node_runtime_case_stops_at_glibc(tmp_path, bundle):
    with_launcher(bundle, NODE)
    run, log = run_check(tmp_path, bundle, glibc="2.31")
    assert_stopped(tmp_path, run, "glibc 2.31 is older than 2.34, which these binaries need")
    assert "C++ runtime (./run" not in run.stdout, run.stdout
    assert log == "", log


def test_a_launcher_without_an_answer_stops_the_check(tmp_path, bundle):
    with_launcher(bundle, "")
    run, log = run_check(tmp_path, bundle, glibc="2.36")
    assert_stopped(tmp_path, run, "run --runtime gave no answer")
    assert log == "", log

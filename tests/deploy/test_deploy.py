"""Checks of deploy/: the Kubernetes manifests, the systemd unit, the Containerfile and the
Slurm scripts.

Run: /usr/bin/python3 -m pytest -q tests/deploy/test_deploy.py   (ctest: label `deploy`)

Needs python3-yaml and python3-pytest. Where they are installed it also runs
`systemd-analyze verify` and `shellcheck`. When STASHD_BIN_DIR names a build tree with
daemon/stashd, the unit is verified against that binary, the knob tables are compared with
`stashd --help`, and the Slurm scripts start and stop the real daemon (host backend).
"""

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DAEMONSET = DEPLOY / "kubernetes" / "stashd-daemonset.yaml"
TRAINING_POD = DEPLOY / "kubernetes" / "example-training-pod.yaml"
UNIT = DEPLOY / "stashd.service"
DEFAULTS = DEPLOY / "stashd.default"
CONTAINERFILE = DEPLOY / "Containerfile"
README = DEPLOY / "README.md"
SLURM = DEPLOY / "slurm"
SHELL_SCRIPTS = sorted(SLURM.glob("*.sh")) + sorted((DEPLOY / "container").glob("*.sh"))

SOCKET_DIR = "/run/stashd"
SOCKET = SOCKET_DIR + "/stashd.sock"


def built_binary(relative):
    """The built binary STASHD_BIN_DIR/<relative>, or None when there is none."""
    bin_dir = os.environ.get("STASHD_BIN_DIR")
    if not bin_dir:
        return None
    path = Path(bin_dir) / relative
    return path if path.is_file() and os.access(path, os.X_OK) else None


# ---- Kubernetes ---------------------------------------------------------------------------------


def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def find_all(node, key):
    """Every value stored under `key` anywhere in a YAML tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from find_all(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from find_all(item, key)


@pytest.fixture(scope="module")
def manifests():
    return load_documents(DAEMONSET)


@pytest.fixture(scope="module")
def daemonset(manifests):
    sets = [d for d in manifests if d.get("kind") == "DaemonSet"]
    assert len(sets) == 1, "expected exactly one DaemonSet in " + str(DAEMONSET)
    return sets[0]


@pytest.fixture(scope="module")
def pod_spec(daemonset):
    return daemonset["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod_spec):
    containers = pod_spec["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_daemonset_is_an_apps_v1_daemonset_whose_selector_matches(daemonset):
    assert daemonset["apiVersion"] == "apps/v1"
    assert daemonset["kind"] == "DaemonSet"
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for key, value in daemonset["spec"]["selector"]["matchLabels"].items():
        assert labels.get(key) == value


def test_manifests_name_no_namespace(manifests):
    for doc in manifests:
        assert "namespace" not in doc.get("metadata", {}), doc["kind"] + " names a namespace"


def test_daemonset_shares_host_ipc_and_pid(pod_spec):
    assert pod_spec.get("hostIPC") is True
    assert pod_spec.get("hostPID") is True


def test_socket_directory_is_a_host_path_mounted_in_the_container(pod_spec, container):
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    socket_volumes = [
        name for name, v in volumes.items() if v.get("hostPath", {}).get("path") == SOCKET_DIR
    ]
    assert len(socket_volumes) == 1, "no hostPath volume for " + SOCKET_DIR
    name = socket_volumes[0]
    assert volumes[name]["hostPath"]["type"] == "DirectoryOrCreate"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert name in mounts, "the socket volume is not mounted in the container"
    assert mounts[name]["mountPath"] == SOCKET_DIR
    assert not mounts[name].get("readOnly", False)


def test_no_gpu_is_claimed_from_the_device_plugin(manifests):
    for doc in manifests:
        for resources in find_all(doc, "resources"):
            for section in ("requests", "limits"):
                assert "nvidia.com/gpu" not in (resources.get(section) or {}), (
                    doc["kind"] + " claims nvidia.com/gpu in " + section
                )


def test_all_gpus_are_visible_through_the_nvidia_runtime(container):
    env = env_of(container)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert "compute" in env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")


def probe_command(container, probe):
    assert probe in container, "no " + probe
    command = container[probe]["exec"]["command"]
    assert isinstance(command, list) and command
    return command


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe", "startupProbe"])
def test_probes_run_stashctl_health_on_the_socket(container, probe):
    command = probe_command(container, probe)
    assert os.path.basename(command[0]) == "stashctl"
    assert "health" in command
    assert "--socket=" + SOCKET in command


def test_daemon_serves_the_socket_the_probes_ask(container):
    command = container.get("command", []) + container.get("args", [])
    assert os.path.basename(command[0]) == "stashd"
    assert "--socket=" + SOCKET in command


def test_daemonset_tolerates_gpu_taint_and_selects_gpu_nodes(pod_spec):
    tolerations = pod_spec.get("tolerations", [])
    assert any(
        t.get("key") == "nvidia.com/gpu"
        and t.get("effect") == "NoSchedule"
        and t.get("operator", "Equal") in ("Exists", "Equal")
        for t in tolerations
    )
    assert pod_spec.get("nodeSelector"), "no nodeSelector: the daemon would land on CPU nodes"


def test_daemonset_is_node_critical_and_stops_gracefully(pod_spec):
    assert pod_spec.get("priorityClassName") == "system-node-critical"
    # stashd exits within 5 s of SIGTERM; leave it time.
    assert pod_spec.get("terminationGracePeriodSeconds", 30) >= 10


def test_container_requests_cpu_and_memory_and_names_an_image(container):
    requests = container["resources"]["requests"]
    assert "cpu" in requests and "memory" in requests
    assert container["image"]


def test_configmap_holds_only_stashd_knobs_and_is_used(manifests, container):
    maps = [d for d in manifests if d.get("kind") == "ConfigMap"]
    assert len(maps) == 1
    config = maps[0]
    assert all(key.startswith("STASHD_") for key in config["data"])
    assert all(isinstance(value, str) for value in config["data"].values())
    refs = [e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e]
    assert config["metadata"]["name"] in refs


def test_example_training_pod_reaches_the_same_socket():
    docs = load_documents(TRAINING_POD)
    assert len(docs) == 1 and docs[0]["kind"] == "Pod"
    spec = docs[0]["spec"]
    assert spec.get("hostIPC") is True and spec.get("hostPID") is True
    volumes = {
        v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v
    }
    trainer = spec["containers"][0]
    socket_mounts = [
        m for m in trainer["volumeMounts"] if volumes.get(m["name"]) == SOCKET_DIR
    ]
    assert len(socket_mounts) == 1
    socket_value = env_of(trainer).get("STASHD_SOCKET")
    assert socket_value == socket_mounts[0]["mountPath"] + "/stashd.sock"


# ---- systemd ------------------------------------------------------------------------------------


def parse_unit(text):
    """{section: {key: [values...]}} of a systemd unit (continuation lines joined)."""
    sections = {}
    current = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, "setting outside a section: " + line
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def only(unit, section, key):
    values = unit[section].get(key)
    assert values, f"{key}= missing from [{section}]"
    assert len(values) == 1, f"{key}= set {len(values)} times"
    return values[0]


def test_unit_runs_stashd_in_the_foreground_on_the_runtime_directory_socket(unit):
    assert only(unit, "Service", "Type") == "notify"  # sd_notify READY=1 once it serves
    assert only(unit, "Service", "NotifyAccess") == "main"
    exec_start = only(unit, "Service", "ExecStart").split()
    assert exec_start[0] == "/usr/local/bin/stashd"
    assert "--socket=" + SOCKET in exec_start
    assert only(unit, "Service", "RuntimeDirectory") == "stashd"
    assert only(unit, "Service", "RuntimeDirectoryMode") == "0750"


def test_unit_restarts_on_failure_and_stops_with_sigterm(unit):
    assert only(unit, "Service", "Restart") == "on-failure"
    assert only(unit, "Service", "KillSignal") == "SIGTERM"
    assert int(only(unit, "Service", "TimeoutStopSec")) >= 10


def test_unit_gives_the_socket_to_the_stashd_group(unit):
    assert only(unit, "Service", "Group") == "stashd"


def test_unit_reads_optional_knobs_and_may_pin_memory(unit):
    assert "-/etc/default/stashd" in unit["Service"]["EnvironmentFile"]
    assert only(unit, "Service", "LimitMEMLOCK") == "infinity"
    assert only(unit, "Install", "WantedBy") == "multi-user.target"


def test_unit_hardening_leaves_the_gpu_devices_open(unit):
    service = unit["Service"]
    # Each of these closes /dev/nvidia* (ProtectClock= implies a DeviceAllow= list).
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert service.get("ProtectClock", ["no"]) == ["no"]
    assert "DeviceAllow" not in service and "DevicePolicy" not in service
    # CUDA IPC events and the host backend's shm live in the host's IPC namespace.
    assert service.get("PrivateIPC", ["no"]) == ["no"]
    assert service.get("NoNewPrivileges") == ["yes"]


def test_unit_needs_no_start_post_polling(unit):
    # Type=notify: stashd says READY=1 itself (tests/integration/systemd_test.py).
    assert "ExecStartPost" not in unit.get("Service", {})


def systemd_verify(unit_file):
    """(exit code, lines about unit_file, full output) of `systemd-analyze verify`."""
    command = ["systemd-analyze", "verify", "--man=no"]
    help_text = subprocess.run(
        ["systemd-analyze", "--help"], capture_output=True, text=True, check=False
    ).stdout
    if "--recursive-errors" in help_text:
        # Judge this unit only, not whatever else is installed on the machine.
        command.append("--recursive-errors=no")
    command.append(str(unit_file))
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    ours = [
        line
        for line in output.splitlines()
        if str(unit_file) in line or unit_file.name in line
    ]
    return result.returncode, ours, output


def unit_with_exec_start(binary):
    """The unit's text with ExecStart's binary replaced (verify wants one that exists)."""
    text = UNIT.read_text(encoding="utf-8")
    text, count = re.subn(
        r"^ExecStart=/usr/local/bin/stashd\b", "ExecStart=" + str(binary), text, flags=re.M
    )
    assert count == 1
    return text


needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    binary = built_binary("daemon/stashd") or Path("/bin/true")
    unit_file = tmp_path / "stashd.service"
    unit_file.write_text(unit_with_exec_start(binary), encoding="utf-8")
    code, ours, output = systemd_verify(unit_file)
    assert code == 0, output
    assert ours == [], "systemd-analyze verify complains about the unit:\n" + "\n".join(ours)


@needs_systemd_analyze
def test_systemd_analyze_verify_reports_a_broken_copy(tmp_path):
    # The check above is only worth something if this systemd names the file when it warns.
    unit_file = tmp_path / "stashd.service"
    text = unit_with_exec_start("/bin/true")
    text = text.replace("Restart=on-failure", "Restart=on-failure\nRestartBogusKey=1")
    unit_file.write_text(text, encoding="utf-8")
    _, ours, output = systemd_verify(unit_file)
    assert any("RestartBogusKey" in line for line in ours), output


# ---- /etc/default/stashd and the knob table -----------------------------------------------------


def commented_settings(path):
    """{KEY: value} of the `#KEY=value` example lines of a defaults file."""
    settings = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#([A-Z][A-Z0-9_]*)=(\S*)$", line)
        if m:
            settings[m.group(1)] = m.group(2)
    return settings


def test_defaults_file_sets_nothing_and_shows_every_knob_commented():
    for line in DEFAULTS.read_text(encoding="utf-8").splitlines():
        assert not line.strip() or line.startswith("#"), "active setting: " + line
    settings = commented_settings(DEFAULTS)
    for knob in ("BACKEND", "POOL_BYTES", "PAGE_BYTES", "HOST_TIER_BYTES", "DEVICES",
                 "LOG_LEVEL", "LISTEN"):
        assert "STASHD_" + knob in settings


def readme_knob_rows():
    """{env var: (flag, default)} from the README's knob table."""
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`STASHD_"):
            flag, env, default = (c.strip("`") for c in cells[:3])
            rows[env] = (flag, default)
    return rows


def test_readme_table_lists_every_knob_of_the_defaults_file():
    rows = readme_knob_rows()
    for key in commented_settings(DEFAULTS):
        if key.startswith("STASHD_"):
            assert key in rows, key + " is missing from deploy/README.md's knob table"


def stashd_help_knobs(stashd):
    """{env var: (flag, default)} as `stashd --help` prints them."""
    text = subprocess.run(
        [str(stashd), "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    knobs = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"^\s+(--[a-z][a-z0-9-]*)=", line)
        if m:
            flag = m.group(1)
        m = re.match(r"^\s+default: (.*); env: (STASHD_[A-Z0-9_]+)$", line)
        if m and flag:
            knobs[m.group(2)] = (flag, m.group(1))
    assert knobs, "could not read the knobs from `stashd --help`:\n" + text
    return knobs


@pytest.mark.skipif(built_binary("daemon/stashd") is None, reason="stashd is not built")
def test_knob_tables_match_stashd_help():
    knobs = stashd_help_knobs(built_binary("daemon/stashd"))
    rows = readme_knob_rows()
    settings = commented_settings(DEFAULTS)
    for env, (flag, default) in knobs.items():
        assert env in rows, env + " is missing from deploy/README.md's knob table"
        assert rows[env][0] == flag
        if default != "(none)":
            assert rows[env][1] == default, f"README says {env} defaults to {rows[env][1]}"
        if env != "STASHD_SOCKET":
            assert env in settings, env + " is missing from deploy/stashd.default"
            if default != "(none)":
                assert settings[env] == default, f"stashd.default shows {env}={settings[env]}"
    assert set(rows) <= set(knobs), "README lists knobs stashd does not have"


@pytest.mark.skipif(built_binary("daemon/stashd") is None, reason="stashd is not built")
@pytest.mark.parametrize("source", ["stashd.default", "ConfigMap"])
def test_stashd_accepts_the_shipped_settings(source, manifests):
    if source == "stashd.default":
        settings = {
            k: v for k, v in commented_settings(DEFAULTS).items() if k.startswith("STASHD_")
        }
    else:
        settings = next(d for d in manifests if d["kind"] == "ConfigMap")["data"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHD_")}
    env.update(settings)
    result = subprocess.run(
        [str(built_binary("daemon/stashd")), "--print-config"],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )
    assert result.returncode == 0, result.stderr


# ---- Containerfile ------------------------------------------------------------------------------


def containerfile_instructions():
    """[(INSTRUCTION, arguments)] with continuation lines joined and comments dropped."""
    instructions = []
    pending = ""
    for raw in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = pending + stripped
        pending = ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, "the Containerfile ends inside a continued line"
    return instructions


def stages():
    """{stage name: [(INSTRUCTION, arguments)]}."""
    result = {}
    current = None
    for word, rest in containerfile_instructions():
        if word == "FROM":
            m = re.match(r"^(\S+)\s+AS\s+(\S+)$", rest, flags=re.I)
            assert m, "every stage is named: FROM " + rest
            current = result.setdefault(m.group(2), [])
        if current is not None:
            current.append((word, rest))
    return result


def test_containerfile_builds_on_debian_12_with_the_dev_packages():
    instructions = containerfile_instructions()
    args = dict(
        rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest
    )
    assert args.get("DEBIAN_IMAGE") == "debian:12"
    build = " ".join(rest for word, rest in stages()["build"] if word == "RUN")
    for package in ("libgrpc++-dev", "protobuf-compiler-grpc", "libprotobuf-dev",
                    "protobuf-compiler", "libspdlog-dev", "libabsl-dev", "cmake",
                    "ninja-build", "g++"):
        assert re.search(r"(^|\s)" + re.escape(package) + r"(\s|$)", build), package
    assert "-DCMAKE_BUILD_TYPE=Release" in build
    assert "--target stashd stashctl" in build


def test_containerfile_runtime_stage_has_no_dev_packages_and_runs_stashd():
    runtime = stages()["runtime"]
    assert not any(word == "RUN" and "-dev" in rest for word, rest in runtime)
    entry = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert entry == ['["/usr/local/bin/stashd"]']
    assert ("STOPSIGNAL", "SIGTERM") in runtime


def test_containerfile_copies_only_files_that_exist():
    for word, rest in containerfile_instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _ = rest.split()
        for source in sources:
            assert (REPO / source).exists(), "COPY of a missing path: " + source


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_containerfile_run_commands_are_valid_sh():
    for word, rest in containerfile_instructions():
        if word == "RUN":
            result = subprocess.run(["sh", "-n", "-c", rest], capture_output=True, text=True)
            assert result.returncode == 0, rest + "\n" + result.stderr


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system")
def test_runtime_packages_names_the_packages_of_the_linked_libraries():
    target = built_binary("daemon/stashd") or Path("/bin/ls")
    result = subprocess.run(
        [str(DEPLOY / "container" / "runtime-packages.sh"), str(target)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    packages = result.stdout.split()
    assert "libc6" in packages
    assert packages == sorted(set(packages))
    assert not any(p.endswith("-dev") for p in packages)


# ---- Shell scripts (Slurm, container helpers) ---------------------------------------------------


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_script_is_executable_and_parses(script):
    assert os.access(script, os.X_OK), str(script) + " is not executable"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "set -euo pipefail" in script.read_text(encoding="utf-8")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_script_is_shellcheck_clean(script):
    result = subprocess.run(
        ["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


FAKE_STASHD = """#!{python}
# Stands in for stashd: serves a Unix socket, records what it saw, obeys SIGTERM.
import os, signal, socket, sys

path = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--socket=")][0]
marker = os.environ["FAKE_STASHD_MARKER"]
mode = os.environ.get("FAKE_STASHD_MODE", "serve")


def note(text):
    with open(marker, "a") as f:
        f.write(text + "\\n")


note("start pid=%d uid=%d socket=%s pool=%s cuda_visible=%s order=%s" % (
    os.getpid(), os.getuid(), path, os.environ.get("STASHD_POOL_BYTES"),
    os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER")))
if mode == "fail":
    sys.exit(3)


def on_term(signum, frame):
    note("term")
    if mode != "ignore-term":
        os.unlink(path)
        sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(16)
while True:
    conn, _ = server.accept()
    conn.close()
"""

FAKE_STASHCTL = """#!{python}
# Stands in for stashctl: `health --socket=PATH` exits 0 when something accepts on PATH.
import socket, sys

args = sys.argv[1:]
if not args or args[0] != "health":
    sys.exit(2)
path = [a.split("=", 1)[1] for a in args if a.startswith("--socket=")][0]
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    client.connect(path)
except OSError:
    sys.exit(1)
sys.exit(0)
"""


def write_executable(path, text):
    path.write_text(text.replace("{python}", sys.executable), encoding="utf-8")
    path.chmod(0o755)


def pid_alive(pid):
    """True while `pid` exists and is not a zombie (as epilog.sh decides)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


class SlurmNode:
    """A temp tree standing in for a node's /run, /var/log and /etc/default, plus the env
    slurmd would give the scripts."""

    def __init__(self, tmp_path, stashd=None, stashctl=None):
        self.tmp = tmp_path
        self.bin_dir = tmp_path / "bin"
        self.bin_dir.mkdir()
        if stashd is None:
            write_executable(self.bin_dir / "stashd", FAKE_STASHD)
        else:
            (self.bin_dir / "stashd").symlink_to(stashd)
        if stashctl is None:
            write_executable(self.bin_dir / "stashctl", FAKE_STASHCTL)
        else:
            (self.bin_dir / "stashctl").symlink_to(stashctl)
        self.job_root = tmp_path / "run" / "stashd-jobs"
        self.log_dir = tmp_path / "log"
        self.defaults = tmp_path / "default-stashd"
        self.defaults.write_text("STASHD_POOL_BYTES=8MiB\n", encoding="utf-8")
        self.service_socket = tmp_path / "run" / "stashd" / "stashd.sock"
        self.marker = tmp_path / "marker"
        self.job_id = "4242"
        self.started = []

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("STASHD_", "STASH_SLURM_", "CUDA_", "SLURM_"))}
        env.update(
            SLURM_JOB_ID=self.job_id,
            SLURM_JOB_UID=str(os.getuid()),
            SLURM_JOB_GID=str(os.getgid()),
            SLURM_JOB_GPUS="0,1",
            STASH_SLURM_DEFAULTS=str(self.defaults),
            STASH_SLURM_BIN_DIR=str(self.bin_dir),
            STASH_SLURM_JOB_ROOT=str(self.job_root),
            STASH_SLURM_LOG_DIR=str(self.log_dir),
            STASH_SLURM_SERVICE_SOCKET=str(self.service_socket),
            STASH_SLURM_START_TIMEOUT_S="30",
            FAKE_STASHD_MARKER=str(self.marker),
        )
        env.update(extra)
        return env

    def run(self, script, **extra):
        result = subprocess.run(
            [str(SLURM / script)], env=self.env(**extra), capture_output=True, text=True,
            timeout=90, stdin=subprocess.DEVNULL, check=False,
        )
        if script == "prolog.sh" and self.pid_file.exists():
            self.started.append(int(self.pid_file.read_text().strip()))
        return result

    @property
    def job_dir(self):
        return self.job_root / self.job_id

    @property
    def socket(self):
        return self.job_dir / "stashd.sock"

    @property
    def pid_file(self):
        return self.job_root / (self.job_id + ".pid")

    def marker_lines(self):
        return self.marker.read_text().splitlines() if self.marker.exists() else []

    def cleanup(self):
        # Only the daemons this test's prolog started, by pid.
        for pid in self.started:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def short_tmp():
    """A fresh temp dir with a short path: Unix socket paths must stay under 108 bytes."""
    base = "/tmp" if os.path.isdir("/tmp") else None
    path = Path(tempfile.mkdtemp(prefix="stashd-deploy-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(short_tmp):
    n = SlurmNode(short_tmp)
    yield n
    n.cleanup()


def test_prolog_starts_a_job_daemon_that_epilog_stops(node):
    result = node.run("prolog.sh")
    assert result.returncode == 0, result.stderr
    assert stat.S_ISSOCK(node.socket.stat().st_mode)
    assert stat.S_IMODE(node.job_dir.stat().st_mode) == 0o700
    pid = int(node.pid_file.read_text())
    assert pid_alive(pid)
    start = node.marker_lines()[0]
    assert f"pid={pid} " in start
    assert f"uid={os.getuid()} " in start
    assert "pool=8MiB " in start  # knobs from /etc/default/stashd reach the daemon
    assert "cuda_visible=0,1 order=PCI_BUS_ID" in start

    task = node.run("task-prolog.sh")
    assert task.returncode == 0, task.stderr
    assert task.stdout == f"export STASHD_SOCKET={node.socket}\n"

    result = node.run("epilog.sh")
    assert result.returncode == 0, result.stderr
    assert "term" in node.marker_lines()
    assert not pid_alive(pid)
    assert not node.job_dir.exists()
    assert not node.pid_file.exists()
    assert "SIGKILL" not in result.stderr


def test_epilog_kills_a_daemon_that_ignores_sigterm(node):
    result = node.run("prolog.sh", FAKE_STASHD_MODE="ignore-term")
    assert result.returncode == 0, result.stderr
    pid = int(node.pid_file.read_text())
    result = node.run("epilog.sh", FAKE_STASHD_MODE="ignore-term", STASH_SLURM_STOP_TIMEOUT_S="1")
    assert result.returncode == 0, result.stderr
    assert "SIGKILL" in result.stderr
    assert "term" in node.marker_lines()
    assert not pid_alive(pid)
    assert not node.job_dir.exists()


@pytest.mark.parametrize("strict,code", [("0", 0), ("1", 1)])
def test_prolog_drains_the_node_on_a_failed_start_only_when_strict(node, strict, code):
    result = node.run("prolog.sh", FAKE_STASHD_MODE="fail", STASH_SLURM_STRICT=strict)
    assert result.returncode == code, result.stderr
    assert "exited during start" in result.stderr
    assert not node.pid_file.exists()
    # Nothing to stop; the epilog still cleans up.
    result = node.run("epilog.sh")
    assert result.returncode == 0, result.stderr
    assert not node.job_dir.exists()


@pytest.mark.parametrize("mode", ["fail", "no-binaries"])
def test_a_job_whose_prolog_could_not_start_stashd_runs_without_a_stash(node, mode):
    """The task prolog tells the tasks so (STASHD_DISABLED=1): connect() then hands out a
    client that stashes nothing instead of raising (tests/python/disabled_test.py)."""
    empty = node.tmp / "empty"
    empty.mkdir()
    extra = ({"FAKE_STASHD_MODE": "fail"} if mode == "fail" else
             {"STASH_SLURM_BIN_DIR": str(empty)})
    result = node.run("prolog.sh", **extra)
    assert result.returncode == 0, result.stderr
    task = node.run("task-prolog.sh")
    assert task.returncode == 0, task.stderr
    assert task.stdout == "export STASHD_DISABLED=1\n"


@pytest.mark.parametrize("strict,code", [("0", 0), ("1", 1)])
def test_prolog_without_binaries_gives_up(node, strict, code):
    empty = node.tmp / "empty"
    empty.mkdir()
    result = node.run("prolog.sh", STASH_SLURM_BIN_DIR=str(empty), STASH_SLURM_STRICT=strict)
    assert result.returncode == code
    assert "no stashd" in result.stderr


def test_prolog_leaves_nodes_with_the_service_alone(node):
    node.service_socket.parent.mkdir(parents=True)
    service = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service.bind(str(node.service_socket))
    service.listen(4)
    try:
        result = node.run("prolog.sh")
    finally:
        service.close()
    assert result.returncode == 0, result.stderr
    assert node.marker_lines() == []
    assert not node.job_dir.exists()
    task = node.run("task-prolog.sh")
    assert task.returncode == 0 and task.stdout == ""
    assert node.run("epilog.sh").returncode == 0


def test_prolog_reuses_a_serving_daemon_of_the_same_job(node):
    assert node.run("prolog.sh").returncode == 0
    pid = int(node.pid_file.read_text())
    result = node.run("prolog.sh")
    assert result.returncode == 0, result.stderr
    assert "already serves" in result.stderr
    assert int(node.pid_file.read_text()) == pid
    assert node.run("epilog.sh").returncode == 0
    assert not pid_alive(pid)


@pytest.mark.skipif(built_binary("daemon/stashd") is None, reason="stashd is not built")
def test_slurm_scripts_start_and_stop_the_real_daemon(short_tmp):
    stashctl = built_binary("client/stashctl")  # the stand-in when not built yet
    n = SlurmNode(short_tmp, stashd=built_binary("daemon/stashd"), stashctl=stashctl)
    n.defaults.write_text(
        "STASHD_BACKEND=host\nSTASHD_POOL_BYTES=8MiB\nSTASHD_HOST_TIER_BYTES=0\n",
        encoding="utf-8",
    )
    try:
        result = n.run("prolog.sh", STASH_SLURM_STRICT="1")
        log = "".join(p.read_text() for p in n.log_dir.glob("*.log"))
        assert result.returncode == 0, result.stderr + log
        pid = int(n.pid_file.read_text())
        assert stat.S_ISSOCK(n.socket.stat().st_mode)
        result = n.run("epilog.sh")
        assert result.returncode == 0, result.stderr
        # stashd exits within 5 s of SIGTERM, well inside the epilog's 10 s.
        assert "SIGKILL" not in result.stderr
        assert not pid_alive(pid)
        assert not n.job_dir.exists()
    finally:
        n.cleanup()

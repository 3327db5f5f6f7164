"""Checks of what operators read and run beside the deploy files: the docs' references and
install commands, and the tooling scripts' failure modes.

Run: /usr/bin/python3 -m pytest -q tests/deploy/test_docs.py   (ctest: label `deploy`)
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tracked_files(*patterns):
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


# ---- references -------------------------------------------------------------------------------


def test_nothing_cites_the_design_document_outside_the_repository():
    # The starting design lives outside the repository; readers of a clone cannot open it.
    offenders = []
    for path in tracked_files("*.md", "*.cc", "*.h", "*.cu", "*.txt", "*.cmake", "*.py", "*.sh"):
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "DESIGN.md" in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "cite docs/design.md instead:\n" + "\n".join(offenders)


def markdown_links(path):
    text = path.read_text(encoding="utf-8")
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)


@pytest.mark.parametrize("doc", ["README.md", "deploy/README.md", "docs/design.md",
                                 "docs/operations.md", "client/python/README.md"])
def test_relative_links_of_the_docs_resolve(doc):
    path = REPO / doc
    if not path.exists():
        pytest.skip(f"{doc} does not exist")
    broken = [link for link in markdown_links(path)
              if "://" not in link and not (path.parent / link).exists()]
    assert not broken, f"{doc} links to missing files: {broken}"


def test_readme_socket_lookup_names_every_place_clients_look():
    # common/socket_path.h: --socket, $STASHD_SOCKET, /run/stashd, then the per-user fallback.
    for doc in ["README.md", "deploy/README.md"]:
        text = " ".join((REPO / doc).read_text(encoding="utf-8").split())
        order = ["$STASHD_SOCKET", "/run/stashd/stashd.sock", "$XDG_RUNTIME_DIR/stashd/stashd.sock",
                 "/tmp/stashd-<uid>/stashd.sock"]
        start = text.find("find the daemon")
        assert start >= 0, f"{doc} does not say how clients find the daemon"
        positions = [text.find(name, start) for name in order]
        assert all(p >= 0 for p in positions), f"{doc} lookup order misses one of {order}"
        assert positions == sorted(positions), f"{doc} lists the lookup out of order: {order}"


def test_install_commands_take_binaries_from_the_release_build_by_path():
    # build/ also holds asan and tsan builds: a `find build -name stashd` may pick one of them.
    text = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    installs = [line for line in text.splitlines() if re.search(r"\binstall\b.*/usr/local/bin", line)]
    assert installs, "deploy/README.md has no install command"
    for line in installs:
        assert "find " not in line, line
        assert "build/release/" in line, line


def test_host_ipc_reason_matches_the_counters_design():
    # Events are counters in memfds (docs/design.md, "Events"), not interprocess CUDA events.
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Why hostIPC and hostPID"):]
    section = section[:section.index("\n## ")]
    assert "cudaIpcGetEventHandle` is never" in section
    assert "counters" in section
    for manifest in (REPO / "deploy" / "kubernetes").glob("*.yaml"):
        text = manifest.read_text(encoding="utf-8")
        assert "CUDA IPC events" not in text, manifest
        assert "Interprocess events" not in text, manifest


# ---- tooling scripts --------------------------------------------------------------------------


@pytest.fixture
def copy_without_git(tmp_path):
    """The scripts folder copied into a directory that is no git checkout."""
    (tmp_path / "scripts").mkdir()
    for name in ["format", "lint"]:
        shutil.copy2(REPO / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "build" / "release").mkdir(parents=True)
    (tmp_path / "build" / "release" / "compile_commands.json").write_text("[]\n")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    return tmp_path, env


@pytest.mark.parametrize("script,args", [("format", []), ("format", ["--check"]), ("lint", [])])
def test_tool_script_fails_when_it_cannot_list_files(copy_without_git, script, args):
    root, env = copy_without_git
    run = subprocess.run([str(root / "scripts" / script), *args], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode != 0, run.stdout + run.stderr
    assert "clean" not in run.stdout, run.stdout
    assert "git" in run.stderr, run.stderr


def test_demo_script_shows_stats_while_the_ranks_hold_pages():
    # stash-demo --hold-command runs while every rank holds its last step's stashes
    # (tests/integration/demo_test.cc, Demo.HoldCommandRunsWhileEveryRankHoldsPages).
    text = (REPO / "scripts" / "demo").read_text(encoding="utf-8")
    demo = text[text.index('"$bin/examples/stash-demo"'):]
    demo = demo[:demo.index("\n\n")]
    assert "--hold-command" in demo and "stashctl stats" in demo, demo


def test_pod_monitor_scrapes_the_port_the_daemonset_serves_metrics_on():
    import yaml
    kube = REPO / "deploy" / "kubernetes"
    monitor = yaml.safe_load((kube / "stashd-podmonitor.yaml").read_text(encoding="utf-8"))
    docs = [d for d in yaml.safe_load_all((kube / "stashd-daemonset.yaml").read_text(
        encoding="utf-8")) if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    assert "namespace" not in monitor["metadata"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert pod_labels.get(key) == value, key
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["path"] == "/metrics"
    port = ports[endpoint["port"]]
    assert config["STASHD_METRICS_LISTEN"].endswith(f":{port}")
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)

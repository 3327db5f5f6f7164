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


# ---- code blocks ------------------------------------------------------------------------------

DOCS_WITH_CODE = ["README.md", "deploy/README.md", "client/python/README.md", "docs/*.md"]
# Modules a snippet may use only after importing them (or binding the name).
MODULES = {"torch", "stashd", "stash_torch", "os", "sys", "json", "subprocess", "np", "time"}


def code_blocks():
    """(doc, line, info words, code) of every fenced block of the docs."""
    out = []
    for path in tracked_files(*DOCS_WITH_CODE):
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\S.*)?$", lines[i])
            if m and m.group(1):
                start, info = i + 1, m.group(1).split()
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
                out.append((str(path.relative_to(REPO)), start, info, "\n".join(lines[start:i])))
            i += 1
    return out


def test_every_python_block_parses_and_imports_what_it_uses():
    """A block that imports anything is a whole snippet: it must import every module it uses
    (the top README's PyTorch snippet used torch without importing it). Blocks that import
    nothing continue an earlier one."""
    import ast
    problems = []
    for doc, line, info, code in code_blocks():
        if info[0] != "python":
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            problems.append(f"{doc}:{line}: does not parse: {e}")
            continue
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
        if not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
            continue
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load) and n.id in MODULES}
        for name in sorted(used - bound):
            problems.append(f"{doc}:{line}: uses {name} without importing it")
    assert not problems, "\n".join(problems)


def _runnable():
    return [(doc, line, info[0], code) for doc, line, info, code in code_blocks()
            if "runs" in info[1:]]


def test_some_blocks_claim_to_run():
    kinds = {kind for _, _, kind, _ in _runnable()}
    assert {"python", "sh"} <= kinds, _runnable()


@pytest.mark.parametrize("doc,line,kind,code", _runnable(),
                         ids=[f"{doc}:{line}" for doc, line, _, _ in _runnable()])
def test_blocks_that_claim_to_run_do(doc, line, kind, code, tmp_path):
    """Blocks tagged ```python runs or ```sh runs run as written against a real stashd (host
    backend): python with the checkout's package on PYTHONPATH, sh with stashctl on PATH."""
    bin_dir = os.environ.get("STASHD_BIN_DIR")
    if not bin_dir:
        pytest.skip("STASHD_BIN_DIR is not set (ctest sets it): no daemon to run the blocks on")
    stashd_bin = Path(bin_dir) / "daemon" / "stashd"
    assert stashd_bin.is_file(), f"{stashd_bin} is not built"
    sock = tmp_path / "s.sock"
    daemon = subprocess.Popen([str(stashd_bin), f"--socket={sock}", "--backend=host",
                               "--pool-bytes=16MiB", "--host-tier-bytes=16MiB",
                               "--page-bytes=64KiB", "--log-level=warn"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        import socket as socket_module
        import time
        deadline = time.monotonic() + 10
        while True:
            probe = socket_module.socket(socket_module.AF_UNIX)
            try:
                probe.connect(str(sock))
                break
            except OSError:
                assert daemon.poll() is None, daemon.stderr.read().decode()
                assert time.monotonic() < deadline, "stashd did not listen within 10 s"
                time.sleep(0.02)
            finally:
                probe.close()
        env = {"PATH": f"{Path(bin_dir) / 'client' / 'stashctl'}:/usr/bin:/bin",
               "HOME": str(tmp_path), "STASHD_SOCKET": str(sock),
               "STASHD_BIN_DIR": bin_dir, "PYTHONPATH": str(REPO / "client" / "python")}
        command = (["/usr/bin/python3", "-c", code] if kind == "python"
                   else ["/bin/bash", "-euo", "pipefail", "-c", code])
        run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=120)
        assert run.returncode == 0, f"{doc}:{line}:\n{code}\n---\n{run.stdout}{run.stderr}"
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)

"""stashd --metrics-listen against promtool and a real Prometheus.

Starts the built stashd (STASHD_BIN_DIR) with /metrics on a free loopback port, holds pages with
stash-demo --hold-command while it fetches /metrics, lints that page with `promtool check
metrics`, checks the series operators graph, then starts Debian's `prometheus` on loopback with
a scrape config for the daemon and asks its HTTP API for the series. Every wait is bounded and
every process is stopped at the end. Skips (saying why) when promtool or prometheus is missing.

Run: ctest -R metrics (label `integration`), or
     STASHD_BIN_DIR=build/release /usr/bin/python3 -m pytest -q tests/integration/metrics_test.py
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

BIN_DIR = Path(os.environ.get("STASHD_BIN_DIR", ""))
STASHD = BIN_DIR / "daemon" / "stashd"
DEMO = BIN_DIR / "examples" / "stash-demo"


def fetch(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


def wait_for(what, check, timeout_s, proc=None, log=None):
    """Polls `check` until it returns something truthy; fails after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n"
                        + (log.read_text() if log else ""))
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s\n" + (log.read_text() if log else ""))
        time.sleep(0.1)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def daemon(tmp_path):
    """(metrics URL, socket, log path) of a stashd serving /metrics on a free loopback port."""
    if not STASHD.is_file():
        pytest.fail(f"{STASHD} is not built (set STASHD_BIN_DIR to a build tree)")
    sock = tmp_path / "stashd.sock"
    log = tmp_path / "stashd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(STASHD), f"--socket={sock}", "--backend=host", "--devices=2",
             "--pool-bytes=16MiB", "--page-bytes=4KiB", "--host-tier-bytes=16MiB",
             "--metrics-listen=127.0.0.1:0"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        port = wait_for(
            "stashd logs its metrics port",
            lambda: (re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
                     or [None])[0],
            15, proc, log)
        yield f"http://127.0.0.1:{port}/metrics", sock, log
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text()


def page_while_ranks_hold_pages(url, sock, tmp_path, extra_args=(), env=None):
    """/metrics as fetched while two stash-demo ranks hold their last step's stashes."""
    page = tmp_path / "metrics.txt"
    getter = ("import sys, urllib.request; "
              "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
    command = f"{sys.executable} -c '{getter}' {url} > {page}"
    run = subprocess.run(
        [str(DEMO), f"--socket={sock}", "--ranks=2", "--devices=2", "--layers=3", "--experts=4",
         "--hidden=64", "--tokens=128", "--steps=2", f"--hold-command={command}", *extra_args],
        capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return page.read_text()


def samples(text):
    """{(name, frozenset(labels)): value} of an exposition page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        assert m, "not an exposition line: " + line
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def test_metrics_pass_promtool_and_show_what_the_ranks_hold(daemon, tmp_path):
    url, sock, _ = daemon
    text = page_while_ranks_hold_pages(url, sock, tmp_path)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing (Debian package `prometheus`; ./scripts/deps installs it)")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr + "\n" + text

    got = samples(text)
    for rank in ("0", "1"):
        key = ("stashd_session_pages_held",
               frozenset({("rank", rank), ("device", rank), ("label", "stash-demo")}))
        assert got.get(key, 0) > 0, f"rank {rank} holds no pages:\n{text}"
    assert got[("stashd_tier_pages_used", frozenset({("tier", "gpu0"), ("device", "0")}))] > 0
    assert got[("stashd_tier_pages", frozenset({("tier", "host"), ("device", "all")}))] == 4096
    assert any(name == "stashd_build_info" for name, _ in got)
    assert got[("stashd_stash_latency_seconds_count", frozenset())] >= 6
    assert ("stashd_copy_throughput_bytes_per_second_bucket",
            frozenset({("direction", "stash"), ("le", "+Inf")})) in got
    # Between scrapes the ranks reloaded and left: the counters stay, the per-session series go.
    after = samples(fetch(url))
    assert after[("stashd_reloads_total", frozenset())] >= 12
    assert not any(name == "stashd_session_pages_held" for name, _ in after)


def test_a_group_has_series_while_it_lives_and_none_after(daemon, tmp_path):
    # Two mapped ranks of one job ($STASHD_GROUP) share pages as a group: per group and per
    # member series while they hold their stashes, none once the group is gone.
    url, sock, _ = daemon
    env = dict(os.environ, STASHD_GROUP="llama-job", STASHD_GROUP_SECRET="07" * 32)
    text = page_while_ranks_hold_pages(url, sock, tmp_path, ["--mode=mapped"], env)
    got = samples(text)
    group = frozenset({("group", "llama-job"), ("uid", str(os.getuid()))})
    assert got[("stashd_group_members", group)] == 2, text
    held = got[("stashd_group_pages_held", group)]
    claimed = got[("stashd_group_pages_claimed", group)]
    assert 0 < claimed <= got[("stashd_group_pages_claimed_high_water", group)] <= held, text
    assert ("stashd_group_depot_misses_total", group) in got
    assert ("stashd_group_chunks_leaving", group) in got
    assert families(text)["stashd_group_depot_misses_total"] == "counter"
    device = sum(got.get(("stashd_group_member_pages_claimed",
                          group | {("rank", rank), ("kind", "device")}), 0) for rank in "01")
    peer_host = sum(got.get(("stashd_group_member_pages_claimed",
                             group | {("rank", rank), ("kind", kind)}), 0)
                    for rank in "01" for kind in ("peer", "host"))
    assert device > 0 and device + peer_host == claimed, text
    after = samples(fetch(url))
    assert not any(name.startswith("stashd_group_") for name, _ in after), after


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_prometheus_scrapes_the_daemon(daemon, tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is missing (Debian package `prometheus`; ./scripts/deps installs it)")
    url, _, _ = daemon
    target = urllib.parse.urlparse(url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: stashd\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        api = f"http://127.0.0.1:{port}/api/v1/query?query="

        def series():
            try:
                reply = json.loads(fetch(api + urllib.parse.quote('stashd_build_info{job="stashd"}')))
            except OSError:
                return None  # not listening yet
            return reply["data"]["result"] or None

        result = wait_for("Prometheus has a stashd_build_info sample", series, 60, proc, log)
        assert result[0]["metric"]["backend"] == "host"
        assert result[0]["value"][1] == "1"
        up = json.loads(fetch(api + urllib.parse.quote('up{job="stashd"}')))["data"]["result"]
        assert up and up[0]["value"][1] == "1", up
    finally:
        stop(proc)


def families(text):
    """{name: type} from the # TYPE lines of an exposition page."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def test_the_series_operators_expect_are_there(daemon, tmp_path):
    url, _, _ = daemon
    text = fetch(url)
    got = samples(text)
    # The process_* series of Prometheus's client libraries, read from /proc of the daemon.
    for name in ("process_resident_memory_bytes", "process_virtual_memory_bytes",
                 "process_open_fds", "process_max_fds", "process_cpu_seconds_total",
                 "process_start_time_seconds"):
        assert (name, frozenset()) in got, f"no {name}:\n{text}"
    assert got[("process_resident_memory_bytes", frozenset())] > 1 << 20
    assert 3 <= got[("process_open_fds", frozenset())] <= got[("process_max_fds", frozenset())]
    started = got[("process_start_time_seconds", frozenset())]
    assert time.time() - 600 < started <= time.time() + 1
    assert got[("stashd_draining", frozenset())] == 0
    config = {dict(labels)["knob"]: dict(labels) for name, labels in got if
              name == "stashd_config_info"}
    assert config["pool_bytes"]["value"] == "16MiB" and config["pool_bytes"]["source"] == "flag"
    assert config["drain_timeout"]["source"] == "default"
    # Bucket bounds as people write them: 1e-05, not 9.999999999999999e-06.
    bounds = re.findall(r'stashd_stash_latency_seconds_bucket\{le="([^"]+)"\}', text)
    assert bounds[:4] == ["1e-05", "2.5e-05", "5e-05", "0.0001"], bounds
    copy_bounds = re.findall(r'copy_throughput_bytes_per_second_bucket\{direction="stash",'
                             r'le="([^"]+)"\}', text)
    for b in bounds + copy_bounds:
        # The shortest text that reads back as the same double (Python's repr), or an integer.
        assert b == "+Inf" or b in (repr(float(b)), str(int(float(b)))), f"le={b!r}"


def test_every_exported_family_is_documented(daemon, tmp_path):
    """docs/operations.md's series table names every family of the page (the exposer's own
    and stashd_tier_chunks_orphaned included)."""
    url, _, _ = daemon
    # Per-session families appear only while sessions exist: scrape while ranks hold pages.
    text = page_while_ranks_hold_pages(*daemon[:2], tmp_path)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = doc.split("## Metrics (Prometheus)", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for cell in re.findall(r"`([a-z_{},]+)`", table):
        # `stashd_session_{stashes,reloads}_total` stands for each name in the braces.
        m = re.match(r"^([a-z_]*)\{([a-z_,]+)\}([a-z_]*)$", cell)
        if m:
            documented.update(m.group(1) + part + m.group(3) for part in m.group(2).split(","))
        else:
            documented.add(cell)
    missing = sorted(set(families(text)) - documented)
    assert not missing, f"families on /metrics that docs/operations.md does not describe: {missing}"


def test_healthz_answers_a_liveness_probe_apart_from_the_socket(daemon):
    # Issue 42: the health service's answers on the --metrics-listen port too, so a probe need
    # not share the trainers' socket or its connection budget. Readiness ("") follows draining;
    # liveness (stash.v1.StashService) stays 1 while the daemon lives.
    url, sock, log = daemon
    healthz = url.replace("/metrics", "/healthz")
    ctl = BIN_DIR / "client" / "stashctl" / "stashctl"
    page = fetch(healthz)
    assert 'stashd_health_serving{service=""} 1' in page, page
    assert 'stashd_health_serving{service="stash.v1.StashService"} 1' in page, page
    subprocess.run([str(ctl), f"--socket={sock}", "drain"], check=True, capture_output=True,
                   timeout=30)
    try:
        page = wait_for("/healthz shows the drain",
                        lambda: (lambda p: p if 'service=""} 0' in p else None)(fetch(healthz)),
                        10)
        assert 'stashd_health_serving{service="stash.v1.StashService"} 1' in page, page
    finally:
        subprocess.run([str(ctl), f"--socket={sock}", "undrain"], check=True,
                       capture_output=True, timeout=30)
    wait_for("/healthz shows the undrain", lambda: 'service=""} 1' in fetch(healthz), 10)

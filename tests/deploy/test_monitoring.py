"""The monitoring that ships: deploy/kubernetes/stashd-prometheusrule.yaml (alerts) and
deploy/grafana/stashd-dashboard.json (Grafana).

promtool checks and unit-tests the alerts on synthetic series (stashd-alerts.test.yaml), checks
every dashboard expression as a recording rule, and the series and labels both name are compared
with what the built daemon exports: a stashd with --metrics-listen is scraped while stash-demo
ranks hold pages, so the per-session families are on the page too. And the overflow alert is
evaluated by promtool on the stashd_overflows_total values scraped around a job that overflows,
in both client modes.

Run: ctest -R deploy.monitoring, or
     STASHD_BIN_DIR=build/release /usr/bin/python3 -m pytest -q tests/deploy/test_monitoring.py
Needs python3-yaml, python3-pytest and Debian's `prometheus` (promtool).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULE = REPO / "deploy" / "kubernetes" / "stashd-prometheusrule.yaml"
RULE_TESTS = Path(__file__).resolve().parent / "stashd-alerts.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "stashd-dashboard.json"
OPERATIONS = REPO / "docs" / "operations.md"

# Labels Prometheus adds at scrape time (PodMonitor relabeling adds `node`) and the histogram's.
SCRAPE_LABELS = {"job", "instance", "node", "le"}
# Grafana's variables, replaced by what they expand to for promtool.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is missing (Debian package `prometheus`; ./scripts/deps installs it)")
    return path


def alert_rules():
    doc = yaml.safe_load(RULE.read_text())
    return doc


def dashboard_exprs():
    """[(panel title, refId, expr)] of every panel target, Grafana variables expanded."""
    out = []

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                out.append((panel["title"], target["refId"], expr))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def run_promtool(*args, cwd):
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_prometheusrule_is_an_operator_rule_that_promtool_accepts(tmp_path):
    doc = alert_rules()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "stashd"
    rules = tmp_path / "stashd-alerts.rules.yaml"
    rules.write_text(yaml.safe_dump(doc["spec"]))
    check = run_promtool("check", "rules", str(rules), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    for rule in doc["spec"]["groups"][0]["rules"]:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


def test_alerts_fire_and_stay_quiet_on_synthetic_series(tmp_path):
    (tmp_path / "stashd-alerts.rules.yaml").write_text(yaml.safe_dump(alert_rules()["spec"]))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    test = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr
    # Every alert is exercised: the unit tests name each one with an expected firing.
    tested = yaml.safe_load(RULE_TESTS.read_text())
    fired = {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"]
             if t.get("exp_alerts")}
    names = {r["alert"] for r in alert_rules()["spec"]["groups"][0]["rules"]}
    assert names == fired, f"alerts without a firing test: {sorted(names - fired)}"


def test_operations_md_describes_exactly_the_shipped_alerts():
    text = OPERATIONS.read_text()
    section = text.split("### Alerts", 1)
    assert len(section) == 2, "docs/operations.md has no '### Alerts' section"
    documented = set(re.findall(r"`(Stashd[A-Za-z]+)`", section[1].split("\n## ", 1)[0]))
    names = {r["alert"] for r in alert_rules()["spec"]["groups"][0]["rules"]}
    assert documented == names, (sorted(documented - names), sorted(names - documented))


def test_every_dashboard_expression_is_valid_promql(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    rules = {"groups": [{"name": "stashd-dashboard", "rules": [
        {"record": f"stashd_dashboard:panel_{i}", "expr": expr}
        for i, (_, _, expr) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    check = run_promtool("check", "rules", str(path), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr + "\n" + path.read_text()


def test_dashboard_covers_what_operators_look_at():
    text = DASHBOARD.read_text()
    for series in ("stashd_tier_used_bytes", "stashd_tier_chunks_leased",
                   "stashd_session_overflows_total", "stashd_spills_total",
                   "stashd_copy_throughput_bytes_per_second_bucket", "stashd_session_held_bytes",
                   "stashd_draining", "process_resident_memory_bytes"):
        assert series in text, f"no panel shows {series}"
    assert "topk(" in text


# ---- Against the daemon's real /metrics page ---------------------------------------------------


def _bin_dir():
    d = os.environ.get("STASHD_BIN_DIR")
    if not d:
        pytest.skip("STASHD_BIN_DIR is not set (ctest sets it): no daemon to scrape")
    return Path(d)


def _start_stashd(tmp_path, flags):
    """A host-backend stashd with --metrics-listen on a free port: (process, socket, metrics URL)."""
    stashd = _bin_dir() / "daemon" / "stashd"
    assert stashd.is_file(), f"{stashd} is not built"
    sock, log = tmp_path / "stashd.sock", tmp_path / "stashd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(stashd), f"--socket={sock}", "--backend=host", "--page-bytes=4KiB",
             "--metrics-listen=127.0.0.1:0", *flags], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:
        found = re.findall(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
        if found:
            return proc, sock, found[0]
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            pytest.fail("no metrics port in the log:\n" + log.read_text())
        time.sleep(0.05)


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def _exported_page(tmp_path):
    demo = _bin_dir() / "examples" / "stash-demo"
    assert demo.is_file(), f"{demo} is not built"
    proc, sock, url = _start_stashd(
        tmp_path, ["--devices=2", "--pool-bytes=16MiB", "--host-tier-bytes=16MiB"])
    try:
        page = tmp_path / "metrics.txt"
        getter = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
                  "sys.argv[1], timeout=5).read().decode())")
        command = f"{sys.executable} -c '{getter}' {url} > {page}"
        run = subprocess.run(
            [str(demo), f"--socket={sock}", "--ranks=2", "--devices=2", "--layers=2",
             "--experts=4", "--hidden=64", "--tokens=128", "--steps=1",
             f"--hold-command={command}"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        return page.read_text()
    finally:
        _stop(proc)


def _names_and_labels(page):
    names, labels = set(), set(SCRAPE_LABELS)
    for line in page.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            names.add(m.group(1))
            if m.group(2) in ("histogram", "summary"):
                names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if m:
            names.add(m.group(1))
            labels.update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(2) or ""))
    return names, labels


def _series_and_labels_of(expr):
    """The stashd_*/process_* series an expression reads and the label names it uses."""
    series = set(re.findall(r"\b((?:stashd|process)_[a-zA-Z0-9_]+)\b(?!\s*\()", expr))
    series = {s for s in series if not s.startswith("stashd_dashboard:")}
    used = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        used.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        used.update(g.strip() for g in grouping.split(",") if g.strip())
    # Strings inside templates ({{ $labels.x }}) are not PromQL: expressions have none.
    return series, used


def test_dashboard_and_alerts_read_only_series_the_daemon_exports(tmp_path):
    page = _exported_page(tmp_path)
    names, labels = _names_and_labels(page)
    exprs = [(f"panel {title!r} {ref}", e) for title, ref, e in dashboard_exprs()]
    exprs += [(f"alert {r['alert']}", r["expr"])
              for r in alert_rules()["spec"]["groups"][0]["rules"]]
    problems = []
    for where, expr in exprs:
        series, used = _series_and_labels_of(expr)
        for s in sorted(series - names):
            problems.append(f"{where}: {s} is not exported")
        for label in sorted(used - labels):
            problems.append(f"{where}: label {label!r} is on no exported series")
    assert not problems, "\n".join(problems) + "\n\nexported: " + ", ".join(sorted(names))


# ---- The overflow alert on what a real job makes the daemon export ----------------------------


def _scraped_counter(url, name):
    page = urllib.request.urlopen(url, timeout=5).read().decode()
    found = re.findall(rf"^{name} (\S+)$", page, re.MULTILINE)
    assert len(found) == 1, f"{name} is not on the page once:\n{page}"
    return float(found[0])


def _humanize(value):
    """Prometheus's `humanize` for the small counts here (Go's %.4g below 1000)."""
    assert value < 1000
    return "%.4g" % value


@pytest.mark.parametrize("mode", ["daemon-copy", "mapped"])
def test_the_overflow_alert_fires_on_the_series_a_job_that_overflows_leaves(tmp_path, mode):
    """Issue 21: a stash-demo job whose pool (mapped: whose lease) is too small overflows; the
    daemon's stashd_overflows_total is scraped before and after it, and promtool evaluates the
    shipped StashdOverflows alert on exactly those values. In mapped mode the rank pages into
    its lease itself: the count reaches the node series only from its control block."""
    demo = _bin_dir() / "examples" / "stash-demo"
    assert demo.is_file(), f"{demo} is not built"
    proc, sock, url = _start_stashd(
        tmp_path, ["--devices=1", "--pool-bytes=512KiB", "--host-tier-bytes=0",
                   "--max-lease-bytes=256KiB"])
    try:
        before = _scraped_counter(url, "stashd_overflows_total")
        run = subprocess.run(
            [str(demo), f"--socket={sock}", f"--mode={mode}", "--ranks=2", "--devices=1",
             "--layers=2", "--experts=4", "--hidden=64", "--tokens=512", "--steps=2"],
            capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        reported = re.findall(r"^total over .* overflows=(\d+)", run.stdout, re.MULTILINE)
        assert reported and int(reported[0]) > 0, "the job did not overflow:\n" + run.stdout
        # The daemon learns a session ended a moment after its rank exits.
        deadline = time.monotonic() + 10
        after = _scraped_counter(url, "stashd_overflows_total")
        while after - before < int(reported[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
            after = _scraped_counter(url, "stashd_overflows_total")
        assert after - before == int(reported[0]), (before, after, run.stdout)
        assert _scraped_counter(url, "stashd_overflows_total") == after, "a counter moved by itself"
    finally:
        _stop(proc)

    rule = next(r for r in alert_rules()["spec"]["groups"][0]["rules"]
                if r["alert"] == "StashdOverflows")

    def render(template):
        return (template.replace("{{ $labels.node }}", "n1")
                .replace("{{ $value | humanize }}", _humanize(after - before)))

    # Scraped once a minute: the value before the job, the job in minute 3, then the value after.
    values = " ".join(["%g" % before] * 3 + ["%g" % after] * 17)
    tests = {
        "rule_files": ["stashd-alerts.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": 'stashd_overflows_total{node="n1"}', "values": values}],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "StashdOverflows", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "StashdOverflows", "exp_alerts": [{
                    "exp_labels": {"severity": rule["labels"]["severity"], "node": "n1"},
                    "exp_annotations": {k: render(v) for k, v in rule["annotations"].items()},
                }]},
            ],
        }],
    }
    (tmp_path / "stashd-alerts.rules.yaml").write_text(yaml.safe_dump(alert_rules()["spec"]))
    (tmp_path / "scraped.test.yaml").write_text(yaml.safe_dump(tests))
    test = run_promtool("test", "rules", "scraped.test.yaml", cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr

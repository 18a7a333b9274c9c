#!/usr/bin/env python3
"""The monitoring files against a real Prometheus scraping a real local cluster.

Starts the local CPU cluster (scripts/cluster.sh, on free ports, round-robin routing so that the
second worker fetches from the kvstore) and Debian's Prometheus server scraping every process
every second with deploy/k8s/monitoring/kvstrata.rules.yml loaded; drives a short shared-prefix
load with `kvstrata request`; then, through Prometheus' HTTP API:

  - every rule group is healthy (no evaluation errors), alerts included;
  - every recording rule has data;
  - every query of the Grafana dashboard (with $__rate_interval set to 1m) has data.

Usage: prometheus_e2e_test.py BUILD_DIR   (standard library only; needs `prometheus` on PATH)
"""

import json
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from local_cluster import ROOT, LocalCluster, free_port  # noqa: E402

MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
SYSTEM_PROMPT = "You are the support assistant of Northwind Outfitters. Follow these rules.\n" + "".join(
    f"Rule {i + 1}: for questions about order {4100 + 37 * i}, check the record, confirm the "
    f"customer's address, and answer politely within {1 + i % 3} business days.\n"
    for i in range(24))
QUESTIONS = ["Which rule covers order 4211?", "What do I confirm first?",
             "How fast must I answer?", "What is rule 2 about?"]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(http_get(url))
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    return body["data"]["result"]


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def dashboard_queries():
    dashboard = json.loads((MONITORING / "kvstrata-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"].replace("$__rate_interval", "1m")


def recording_rules():
    # The rules file is YAML; its record names are found without a YAML library.
    for line in (MONITORING / "kvstrata.rules.yml").read_text().splitlines():
        line = line.strip()
        if line.startswith("- record:"):
            yield line.split(":", 1)[1].strip()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build_dir = pathlib.Path(sys.argv[1]).resolve()
    if shutil.which("prometheus") is None:
        print("prometheus is not installed (scripts/install-deps.sh installs it)", file=sys.stderr)
        return 1
    work = pathlib.Path(tempfile.mkdtemp(prefix="kvstrata-prom-e2e-"))
    prom_port = free_port()
    failures = []
    print("starting the local cluster", flush=True)
    cluster = LocalCluster(build_dir, policy="round-robin")
    with cluster:
        config = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s",
                  "rule_files:", f"  - {MONITORING / 'kvstrata.rules.yml'}", "scrape_configs:"]
        for job, job_ports in cluster.metrics_ports.items():
            config += [f"  - job_name: {job}", "    static_configs:",
                       "      - targets: [" + ", ".join(f"'127.0.0.1:{p}'" for p in job_ports)
                       + "]"]
        (work / "prometheus.yml").write_text("\n".join(config) + "\n")
        print(f"starting prometheus on port {prom_port}", flush=True)
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(work / "prometheus.log", "w"), stderr=subprocess.STDOUT)
        try:
            failures = check(cluster, prom_port)
        except (OSError, RuntimeError, TimeoutError) as e:
            failures = [f"{type(e).__name__}: {e}"]
        finally:
            prometheus.send_signal(signal.SIGTERM)
            try:
                prometheus.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prometheus.kill()
    if failures:
        for log in cluster.logs() + [work / "prometheus.log"]:
            if log.exists():
                print(f"---- {log.name} (tail) ----\n{log.read_text()[-2000:]}")
    for f in failures:
        print(f"FAIL: {f}")
    print("OK: every rule healthy, every recording rule and dashboard query has data"
          if not failures else f"{len(failures)} problem(s)")
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cluster.work, ignore_errors=True)
    return 1 if failures else 0


def check(cluster, prom_port):
    """Drives the load, then checks the rules and dashboard queries; the failures found."""
    failures = []
    wait_for("prometheus to be ready",
             lambda: "Ready" in http_get(f"http://127.0.0.1:{prom_port}/-/ready"), 60)
    wait_for("every target to be up", lambda: len(query(prom_port, "up == 1")) == 4, 60)

    # Shared-prefix load. Round-robin alternates the workers: the second request's prefix is
    # fetched from the kvstore once the first worker has published it, later ones hit locally.
    for i, question in enumerate(QUESTIONS):
        print(f"request {i + 1}: {question}", flush=True)
        cluster.request(SYSTEM_PROMPT, question, 8, deadline_ms=120000)
        if i == 0:
            wait_for("the first request's pages in the kvstore", lambda: any(
                float(r["value"][1]) > 0
                for r in query(prom_port, "kvstrata_kvstore_pages")), 30)
    # Let every rule evaluate over scrapes that saw the whole load.
    time.sleep(5)

    groups = json.loads(http_get(f"http://127.0.0.1:{prom_port}/api/v1/rules"))["data"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("health") != "ok":
                failures.append(f"rule {rule['name']}: health {rule.get('health')}: "
                                f"{rule.get('lastError')}")
    print(f"{sum(len(g['rules']) for g in groups)} rules loaded", flush=True)

    for name in recording_rules():
        result = query(prom_port, name)
        print(f"  recording rule {name}: {len(result)} series", flush=True)
        if not result:
            failures.append(f"recording rule {name} has no data")
    for title, expr in dashboard_queries():
        result = query(prom_port, expr)
        print(f"  panel '{title}': {len(result)} series", flush=True)
        if not result:
            failures.append(f"dashboard panel '{title}' query has no data: {expr}")
    return failures


if __name__ == "__main__":
    sys.exit(main())

"""The local CPU cluster (scripts/cluster.sh) from Python, for tests and benchmarks.

    with LocalCluster(build_dir, policy="round-robin") as cluster:
        row = cluster.request(system="...", question="...", max_tokens=8)
        print(row["ttft_ms"], cluster.metrics_ports, cluster.openai_base_url)

Each cluster runs on free loopback ports with its logs in a private folder, so it never clashes
with a cluster started by hand. Standard library only.
"""

import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
_PORTS = ["ROUTER_PORT", "ROUTER_METRICS_PORT", "ROUTER_HTTP_PORT", "DECODE0_PORT",
          "DECODE0_METRICS_PORT", "DECODE1_PORT", "DECODE1_METRICS_PORT", "KVSTORE_PORT",
          "KVSTORE_METRICS_PORT"]
# The summary line `kvstrata request` prints on stderr.
_SUMMARY = re.compile(r"worker=(\S+) .* prompt_tokens=(\d+) cached_local=(\d+) "
                      r"cached_kvstore=(\d+) .* ttft_ms=([\d.]+) total_ms=([\d.]+)")


_given_ports = set()


def free_port():
    """A loopback port that was free a moment ago, never the same one twice in this process (the
    kernel hands a just-released port out again, and the ports are all picked before any server
    binds them)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given_ports:
            _given_ports.add(port)
            return port


class LocalCluster:
    def __init__(self, build_dir, policy="prefix-affinity"):
        self.build_dir = pathlib.Path(build_dir).resolve()
        self.kvstrata = str(self.build_dir / "bin" / "kvstrata")
        self.ports = {name: free_port() for name in _PORTS}
        self.work = pathlib.Path(tempfile.mkdtemp(prefix=f"kvstrata-cluster-{policy}-"))
        self.env = dict(os.environ, BUILD_DIR=str(self.build_dir),
                        KVSTRATA_CLUSTER_DIR=str(self.work), KVSTRATA_ROUTER_POLICY=policy,
                        **{f"KVSTRATA_{name}": str(port) for name, port in self.ports.items()})
        self.router = f"127.0.0.1:{self.ports['ROUTER_PORT']}"
        # The router's OpenAI-compatible HTTP front, as an OpenAI client's base_url.
        self.openai_base_url = f"http://127.0.0.1:{self.ports['ROUTER_HTTP_PORT']}/v1"
        # /metrics port of each process, by Prometheus job name.
        self.metrics_ports = {
            "kvstrata-router": [self.ports["ROUTER_METRICS_PORT"]],
            "kvstrata-decode": [self.ports["DECODE0_METRICS_PORT"],
                                self.ports["DECODE1_METRICS_PORT"]],
            "kvstrata-kvstore": [self.ports["KVSTORE_METRICS_PORT"]],
        }

    def _cluster(self, command, check):
        subprocess.run([str(ROOT / "scripts" / "cluster.sh"), command], env=self.env,
                       check=check, stdout=sys.stderr)

    def __enter__(self):
        self._cluster("up", check=True)
        return self

    def __exit__(self, *exc):
        self._cluster("down", check=False)
        return False

    def logs(self):
        """The processes' log files."""
        return sorted(self.work.glob("*.log"))

    def request(self, system, question, max_tokens, deadline_ms=300000):
        """One greedy chat request through the router; the parsed summary line."""
        done = subprocess.run(
            [self.kvstrata, "request", f"--target={self.router}", "--chat", f"--system={system}",
             f"--prompt={question}", f"--max_tokens={max_tokens}", f"--deadline_ms={deadline_ms}"],
            env=self.env, capture_output=True, text=True)
        m = _SUMMARY.search(done.stderr)
        if done.returncode != 0 or not m:
            raise RuntimeError(f"request failed: {done.stderr.strip()}")
        return {"worker": m[1], "prompt_tokens": int(m[2]), "cached_local": int(m[3]),
                "cached_kvstore": int(m[4]), "ttft_ms": float(m[5]), "total_ms": float(m[6])}

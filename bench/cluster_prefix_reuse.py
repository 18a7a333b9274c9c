#!/usr/bin/env python3
"""Time to first token with and without prefix reuse, on the local CPU cluster.

Starts scripts/cluster.sh (kvstore, router with round-robin routing, two decode workers) on free
ports and sends chat requests through the router, each a long shared system prompt plus a short
question, in three conditions measured side by side in one run:

  cold     a system prompt no request used before: the whole prompt is prefilled
  kvstore  the prompt's pages were published by the other worker: fetched from the kvstore
  local    the prompt's pages are in the serving worker's local page tier

Round-robin alternates the two workers, so for each fresh system prompt the first request is
cold (worker A), the second fetches from the kvstore (worker B, after A published), and the
third and fourth hit the local tier (A, then B). Reports the median TTFT of each condition and
the ratios, as Markdown, and writes the raw rows as JSON.

Usage: bench/cluster_prefix_reuse.py [--build-dir build] [--rounds 5] [--out FILE.json]
Standard library only.
"""

import argparse
import json
import os
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"worker=(\S+) .* prompt_tokens=(\d+) cached_local=(\d+) "
                     r"cached_kvstore=(\d+) .* ttft_ms=([\d.]+) total_ms=([\d.]+)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_prompt(variant):
    rules = "".join(
        f"Rule {i + 1}: for questions about order {4100 + 37 * i + variant}, check the record, "
        f"confirm the customer's address, and answer politely within {1 + i % 3} business "
        "days.\n" for i in range(40))
    return f"You are support assistant number {variant} of Northwind Outfitters.\n" + rules


def ask(kvstrata, router, system, question, env):
    done = subprocess.run(
        [kvstrata, "request", f"--target={router}", "--chat", f"--system={system}",
         f"--prompt={question}", "--max_tokens=4", "--deadline_ms=300000"],
        env=env, check=True, capture_output=True, text=True)
    m = SUMMARY.search(done.stderr)
    if not m:
        raise RuntimeError(f"no summary line in: {done.stderr}")
    return {"worker": m[1], "prompt_tokens": int(m[2]), "cached_local": int(m[3]),
            "cached_kvstore": int(m[4]), "ttft_ms": float(m[5]), "total_ms": float(m[6])}


def wait_stored(kvstrata, metrics_port, at_least, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            body = subprocess.run(["curl", "-s", f"http://127.0.0.1:{metrics_port}/metrics"],
                                  capture_output=True, text=True).stdout
            for line in body.splitlines():
                if line.startswith("kvstrata_kvstore_pages "):
                    if float(line.split()[1]) >= at_least:
                        return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the kvstore did not receive the published pages")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--rounds", type=int, default=5, help="fresh system prompts (default 5)")
    parser.add_argument("--out", help="write the raw rows here as JSON")
    args = parser.parse_args()
    build = pathlib.Path(args.build_dir).resolve()
    kvstrata = str(build / "bin" / "kvstrata")
    ports = {n: free_port() for n in [
        "ROUTER_PORT", "ROUTER_METRICS_PORT", "DECODE0_PORT", "DECODE0_METRICS_PORT",
        "DECODE1_PORT", "DECODE1_METRICS_PORT", "KVSTORE_PORT", "KVSTORE_METRICS_PORT"]}
    work = pathlib.Path(tempfile.mkdtemp(prefix="kvstrata-bench-"))
    env = dict(os.environ, BUILD_DIR=str(build), KVSTRATA_CLUSTER_DIR=str(work),
               KVSTRATA_ROUTER_POLICY="round-robin",
               **{f"KVSTRATA_{k}": str(v) for k, v in ports.items()})
    cluster = [str(ROOT / "scripts" / "cluster.sh")]
    router = f"127.0.0.1:{ports['ROUTER_PORT']}"
    rows = []
    subprocess.run(cluster + ["up"], env=env, check=True, stdout=sys.stderr)
    try:
        stored = 0
        for r in range(args.rounds):
            system = system_prompt(r)
            for i, condition in enumerate(["cold", "kvstore", "local", "local"]):
                row = ask(kvstrata, router, system, f"Which rule covers order {4100 + i}?", env)
                row.update(condition=condition, round=r)
                rows.append(row)
                print(f"round {r} {condition:7s} {row['worker']}: ttft {row['ttft_ms']:.0f} ms, "
                      f"cached local {row['cached_local']} kvstore {row['cached_kvstore']} of "
                      f"{row['prompt_tokens']}", file=sys.stderr, flush=True)
                if condition == "cold":
                    stored += (row["prompt_tokens"] - 1) // 64
                    wait_stored(kvstrata, ports["KVSTORE_METRICS_PORT"], stored)
    finally:
        subprocess.run(cluster + ["down"], env=env, stdout=sys.stderr)
    for row in rows:
        expected = {"cold": (0, 0), "kvstore": (0, 1), "local": (1, 0)}[row["condition"]]
        got = (row["cached_local"] > 0, row["cached_kvstore"] > 0)
        if got != tuple(bool(x) for x in expected):
            print(f"warning: round {row['round']} {row['condition']} had cached local "
                  f"{row['cached_local']}, kvstore {row['cached_kvstore']}", file=sys.stderr)
    median = {c: statistics.median(r["ttft_ms"] for r in rows if r["condition"] == c)
              for c in ("cold", "kvstore", "local")}
    tokens = statistics.median(r["prompt_tokens"] for r in rows)
    print(f"| condition | median TTFT (ms) | vs cold |")
    print(f"|---|---:|---:|")
    for c in ("cold", "kvstore", "local"):
        print(f"| {c} | {median[c]:.0f} | {median['cold'] / median[c]:.1f}x faster |"
              if c != "cold" else f"| {c} | {median[c]:.0f} | 1.0x |")
    print(f"\n{args.rounds} rounds, prompt ~{tokens:.0f} tokens, 4 generated tokens per request.")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

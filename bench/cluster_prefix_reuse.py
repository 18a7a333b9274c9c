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
import pathlib
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
from local_cluster import ROOT, LocalCluster  # noqa: E402


def system_prompt(variant):
    rules = "".join(
        f"Rule {i + 1}: for questions about order {4100 + 37 * i + variant}, check the record, "
        f"confirm the customer's address, and answer politely within {1 + i % 3} business "
        "days.\n" for i in range(40))
    return f"You are support assistant number {variant} of Northwind Outfitters.\n" + rules


def wait_stored(metrics_port, at_least, timeout=60):
    """Until the kvstore holds `at_least` pages (its kvstrata_kvstore_pages gauge)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("kvstrata_kvstore_pages ") and \
                            float(line.split()[1]) >= at_least:
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
    rows = []
    with LocalCluster(args.build_dir, policy="round-robin") as cluster:
        stored = 0
        for r in range(args.rounds):
            system = system_prompt(r)
            for i, condition in enumerate(["cold", "kvstore", "local", "local"]):
                row = cluster.request(system, f"Which rule covers order {4100 + i}?", 4)
                row.update(condition=condition, round=r)
                rows.append(row)
                print(f"round {r} {condition:7s} {row['worker']}: ttft {row['ttft_ms']:.0f} ms, "
                      f"cached local {row['cached_local']} kvstore {row['cached_kvstore']} of "
                      f"{row['prompt_tokens']}", file=sys.stderr, flush=True)
                if condition == "cold":
                    stored += (row["prompt_tokens"] - 1) // 64
                    wait_stored(cluster.ports["KVSTORE_METRICS_PORT"], stored)
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

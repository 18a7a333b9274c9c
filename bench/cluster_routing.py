#!/usr/bin/env python3
"""Routing policies compared on the local CPU cluster, under concurrent shared-prefix load.

For each policy, starts scripts/cluster.sh (kvstore, router with that policy, two decode workers)
on free ports and runs the same workload through the router: `--clients` concurrent clients
each send `--requests` chat requests; every request uses one of `--prompts` system prompts
(~`--prompt-rules` x 30 tokens each) plus a short question, in a fixed pseudo-random order.
Reports per policy: cache hit ratio by tier, the router's predicted against actual cached
tokens, mean and median time to first token, wall time, and how requests split over the
workers, as Markdown; raw rows as JSON with --out.

Usage: bench/cluster_routing.py [--build-dir build] [--policies a,b] [--out FILE.json]
Standard library only.
"""

import argparse
import json
import pathlib
import random
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
from local_cluster import ROOT, LocalCluster  # noqa: E402

PREDICTED = re.compile(r"predicted cached (\d+) .*actual (\d+)")


def system_prompt(team, rules):
    return f"You are the assistant of the {team} team. Their handbook:\n" + "".join(
        f"{team} guideline {i + 1}: keep notes for ticket {700 + 13 * i} and reply to the "
        "requester the same day.\n" for i in range(rules))


def run_policy(policy, args):
    teams = [f"team-{chr(ord('a') + i)}" for i in range(args.prompts)]
    rows, lock = [], threading.Lock()
    with LocalCluster(args.build_dir, policy=policy) as cluster:
        def client(c):
            rng = random.Random(1000 + c)
            for i in range(args.requests):
                team = rng.choice(teams)
                row = cluster.request(system_prompt(team, args.prompt_rules),
                                      f"Question {c}-{i}: who replies first?", 8,
                                      deadline_ms=600000)
                row.update(policy=policy, client=c, team=team)
                with lock:
                    rows.append(row)

        start = time.time()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - start
    predicted = actual = 0
    for line in (cluster.work / "router.log").read_text().splitlines():
        m = PREDICTED.search(line)
        if m:
            predicted += int(m[1])
            actual += int(m[2])
    return rows, wall, predicted, actual


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--policies", default="round-robin,least-load,cache-aware,prefix-affinity")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="per client")
    parser.add_argument("--prompts", type=int, default=4, help="distinct system prompts")
    parser.add_argument("--prompt-rules", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    all_rows = []
    print("| policy | hit ratio (local + kvstore) | local | kvstore | predicted / actual cached "
          "| mean TTFT (ms) | median TTFT (ms) | wall (s) | requests per worker |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for policy in args.policies.split(","):
        print(f"running {policy}", file=sys.stderr, flush=True)
        rows, wall, predicted, actual = run_policy(policy, args)
        all_rows += rows
        prompt = sum(r["prompt_tokens"] for r in rows)
        local = sum(r["cached_local"] for r in rows)
        kv = sum(r["cached_kvstore"] for r in rows)
        ttft = [r["ttft_ms"] for r in rows]
        per_worker = {}
        for r in rows:
            per_worker[r["worker"]] = per_worker.get(r["worker"], 0) + 1
        print(f"| {policy} | {(local + kv) / prompt:.1%} | {local / prompt:.1%} | "
              f"{kv / prompt:.1%} | {predicted / max(1, actual):.2f} | "
              f"{statistics.mean(ttft):.0f} | {statistics.median(ttft):.0f} | {wall:.1f} | "
              + ", ".join(f"{w} {n}" for w, n in sorted(per_worker.items())) + " |", flush=True)
    print(f"\n{args.clients} concurrent clients x {args.requests} requests, {args.prompts} system "
          f"prompts of ~{statistics.median(r['prompt_tokens'] for r in all_rows):.0f} prompt "
          "tokens, 8 generated tokens per request.")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(all_rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PNG plots and a side-by-side table of kvstrata-loadtest runs (their --json files).

  loadtest/report.sh OUT_DIR RUN.json [RUN.json ...]

writes into OUT_DIR:
  latency.png     CDFs of TTFT, time per output token and end-to-end latency, one line per run
  over_time.png   output tokens/s, completed requests/s and the cache hit ratio per 10 s of the run
  workers.png     requests served per worker, per run
  stages.png      per stage (runs made with --stages): TTFT p50 and p99, output tokens/s
  compare.md      the runs' summaries side by side (a Markdown table)
Each run is labelled by its file name. Requests of the warm-up are left out, as in the summary.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        run = json.load(f)
    run["label"] = os.path.splitext(os.path.basename(path))[0]
    run["measured"] = [r for r in run["requests"] if not r["warmup"]]
    return run


def cdf(ax, values, label):
    v = sorted(x for x in values if x is not None and x >= 0)
    if v:
        ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], [load(p) for p in sys.argv[2:]]
    os.makedirs(out, exist_ok=True)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        ok = [r for r in run["measured"] if r["status"] == "OK"]
        cdf(axes[0], [r["ttft_ms"] for r in ok], run["label"])
        cdf(axes[1], [r["tpot_ms"] for r in ok], run["label"])
        cdf(axes[2], [r["e2e_ms"] for r in ok], run["label"])
    for ax, title in zip(axes, ["time to first token", "time per output token", "end to end"]):
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency.png"), dpi=110)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        buckets = {}
        for r in run["measured"]:
            end = r["sent_s"] + r["e2e_ms"] / 1e3
            b = buckets.setdefault(int(end // 10), {"tok": 0, "req": 0, "prompt": 0, "cached": 0})
            if r["status"] == "OK":
                b["tok"] += r["completion_tokens"]
                b["req"] += 1
                b["prompt"] += r["prompt_tokens"]
                b["cached"] += r["cached_local_tokens"] + r["cached_kvstore_tokens"]
        keys = sorted(buckets)
        t = [10 * k + 5 for k in keys]
        axes[0].plot(t, [buckets[k]["tok"] / 10 for k in keys], label=run["label"])
        axes[1].plot(t, [buckets[k]["req"] / 10 for k in keys], label=run["label"])
        axes[2].plot(t, [100 * buckets[k]["cached"] / max(1, buckets[k]["prompt"]) for k in keys],
                     label=run["label"])
    for ax, (title, unit) in zip(axes, [("output tokens per second", "tok/s"),
                                        ("completed requests per second", "req/s"),
                                        ("cache hit ratio", "% of prompt tokens")]):
        ax.set_title(title)
        ax.set_xlabel("s into the run")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "over_time.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(8, 4))
    workers = sorted({r["worker_id"] for run in runs for r in run["measured"] if r["worker_id"]})
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        counts = [sum(1 for r in run["measured"] if r["worker_id"] == w) for w in workers]
        ax.bar([x + i * width for x in range(len(workers))], counts, width, label=run["label"])
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workers))], workers)
    ax.set_ylabel("requests served")
    ax.set_title("load per worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "workers.png"), dpi=110)

    staged = [run for run in runs if run.get("stages")]
    if staged:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for run in staged:
            x = range(1, len(run["stages"]) + 1)
            line = axes[0].plot(x, [st["ttft_ms"]["p50"] for st in run["stages"]], marker="o",
                                label=f"{run['label']} p50")[0]
            axes[0].plot(x, [st["ttft_ms"]["p99"] for st in run["stages"]], marker="o",
                         linestyle="--", color=line.get_color(), label=f"{run['label']} p99")
            axes[1].plot(x, [st["output_tokens_per_s"] for st in run["stages"]], marker="o",
                         label=run["label"])
        labels = [st["label"] for st in staged[0]["stages"]]
        for ax, (title, unit) in zip(axes, [("time to first token", "ms"),
                                            ("output tokens per second", "tok/s")]):
            ax.set_title(f"{title}, per stage")
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "stages.png"), dpi=110)

    rows = [
        ("requests OK / measured", lambda s: f"{s['ok']} / {s['requests']}"),
        ("requests/s", lambda s: f"{s['requests_per_s']:.2f}"),
        ("output tok/s", lambda s: f"{s['output_tokens_per_s']:.1f}"),
        ("TTFT p50 / p99 ms", lambda s: f"{s['ttft_ms']['p50']:.0f} / {s['ttft_ms']['p99']:.0f}"),
        ("TPOT p50 / p99 ms", lambda s: f"{s['tpot_ms']['p50']:.1f} / {s['tpot_ms']['p99']:.1f}"),
        ("end to end p50 / p99 ms", lambda s: f"{s['e2e_ms']['p50']:.0f} / {s['e2e_ms']['p99']:.0f}"),
        ("goodput req/s", lambda s: f"{s['goodput_per_s']:.2f}"),
        ("hit ratio", lambda s: f"{100 * s['hit_ratio']:.1f} %"),
        ("predicted / actual cached", lambda s: f"{s['predicted_over_actual_cached']:.2f}"),
        ("statuses", lambda s: ", ".join(f"{k} {v}" for k, v in s["by_status"].items())),
        ("client CPU cores", lambda s: f"{s['client_cpu_cores']:.2f}"
                                       + (" (client-bound)" if s["client_bound"] else "")),
    ]
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write("| | " + " | ".join(r["label"] for r in runs) + " |\n")
        f.write("|---|" + "---:|" * len(runs) + "\n")
        for name, fmt in rows:
            f.write(f"| {name} | " + " | ".join(fmt(r["summary"]) for r in runs) + " |\n")
    print(f"plot_report: {len(runs)} run(s) -> {out}/latency.png over_time.png workers.png "
          + ("stages.png " if staged else "") + "compare.md", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Plots of `kvstrata eval --json` results (scripts/plot-fidelity.sh).

    plot_fidelity.py RESULTS.json OUT.png
        KL divergence vs exact bits per element, one point per format and context (round 1).
    plot_fidelity.py --vs turbo3 --only A,B,C OUT.png RESULTS.json ...
        Mean KL of each format over the baseline's, per context, with paired 95 % bootstrap
        intervals over windows (scripts/fidelity_ci.py's); results of one context pair up only
        when they ran on the same windows (same window count).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = {1024: "o", 2048: "s", 4096: "^", 8192: "D"}


def main(results_path: str, out_path: str) -> None:
    with open(results_path) as f:
        report = json.load(f)
    rows = [r for r in report["results"] if r["kl_mean"] > 0]
    formats = list(dict.fromkeys(r["format"] for r in rows))
    colors = {name: plt.cm.tab20(i % 20) for i, name in enumerate(formats)}
    fig, ax = plt.subplots(figsize=(11, 6.5))
    for name in formats:
        pts = sorted((r["context"], r["bits_per_element"], r["kl_mean"]) for r in rows
                     if r["format"] == name)
        ours = name == "oscar"
        ax.plot([p[1] for p in pts], [p[2] for p in pts], "-", color=colors[name],
                alpha=0.9 if ours else 0.45, linewidth=2.5 if ours else 1.2,
                label=f"{name} (ours)" if ours else name)
        for ctx, bpe, kl in pts:
            ax.scatter(bpe, kl, color=colors[name], marker=MARKERS.get(ctx, "x"),
                       s=70 if ours else 40, edgecolors="black", linewidths=1.2 if ours else 0.4,
                       zorder=4 if ours else 3)
    for ctx, marker in MARKERS.items():
        ax.scatter([], [], marker=marker, color="white", edgecolors="black",
                   label=f"context {ctx // 1024}K")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("exact bits per element of the whole KV cache at that context "
                  "(windows, scales and headers counted)")
    ax.set_ylabel("mean KL(p_BF16 || p_format) per token (nats)")
    model = report["model"]["name"]
    ax.set_title(f"KV-cache formats on {model}: teacher-forced KL vs the BF16 cache\n"
                 "one point per format and context; lines join a format's contexts",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    print(f"wrote {out_path}")


def ratio_plot(baseline: str, only: list, out_path: str, paths: list) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fidelity_ci import bootstrap, mean  # noqa: E402 (the same intervals as the tables)

    results = []
    for path in paths:
        with open(path) as f:
            results += json.load(f)["results"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    contexts = sorted({r["context"] for r in results})
    drawn = []
    for i, name in enumerate(only):
        xs, ys, lo, hi = [], [], [], []
        for ctx in contexts:
            at = [r for r in results if r["context"] == ctx]
            # the run with the most windows where both formats ran on the same windows
            pairs = [(a, b) for a in at for b in at if a["format"] == name
                     and b["format"] == baseline and len(a["window_kl"]) == len(b["window_kl"])]
            if not pairs:
                continue
            a, b = max(pairs, key=lambda p: len(p[0]["window_kl"]))
            _, (rlo, rhi) = bootstrap(a["window_kl"], b["window_kl"])
            r = mean(a["window_kl"]) / mean(b["window_kl"])
            xs.append(ctx * (1 + 0.025 * (i - len(only) / 2)))  # side by side, not on top
            ys.append(r)
            lo.append(r - rlo)
            hi.append(rhi - r)
        if not xs:
            continue
        bits = max(r["history_bits_per_element"] for r in results if r["format"] == name)
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, linewidth=1.5,
                    color=plt.cm.tab10(i % 10), label=f"{name} ({bits:.3f} history bits)")
        drawn.append(name)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--",
               label=f"{baseline} (the goal: at or below this line)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts)
    ax.set_xticklabels([f"{c // 1024}K" for c in contexts])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"mean KL / {baseline}'s mean KL (same windows)")
    ax.set_title(f"History codecs against {baseline} on the evaluation set: paired 95 % "
                 "bootstrap intervals over windows", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    print(f"wrote {out_path} ({', '.join(drawn)})")


if __name__ == "__main__":
    if sys.argv[1] == "--vs":
        # --vs BASELINE --only A,B OUT.png RESULTS.json ...
        ratio_plot(sys.argv[2], sys.argv[4].split(","), sys.argv[5], sys.argv[6:])
    else:
        main(sys.argv[1], sys.argv[2])

"""KL divergence vs bits per element from `kvstrata eval --json` (scripts/plot-fidelity.sh)."""
import json
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Markdown tables of `kvstrata eval --json` results (for docs/fidelity.md). Standard library only.

    python3 scripts/fidelity_table.py RESULTS.json
"""
import json
import sys


def main(path: str) -> None:
    with open(path) as f:
        report = json.load(f)
    results = report["results"]
    contexts = sorted({r["context"] for r in results})
    print("| format | context | bits/elem | history bits | PPL | ΔPPL | KL mean | KL p99 | "
          "KL (history positions) | top-1 | attn-score KL | attn-out rel. err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ctx in contexts:
        for r in (r for r in results if r["context"] == ctx):
            print(f"| {r['format']} | {ctx} | {r['bits_per_element']:.3f} | "
                  f"{r['history_bits_per_element']:.2f} | {r['ppl']:.3f} | "
                  f"{100 * r['ppl_change']:+.2f}% | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | "
                  f"{r['kl_history_mean']:.2e} | {100 * r['top1']:.2f}% | "
                  f"{r['attention_score_kl']:.2e} | {r['attention_output_rel_error']:.3f} |")
    print()
    print("Reference (BF16 cache) perplexity per context: " + ", ".join(
        f"{ctx}: {next(r['ppl_reference'] for r in results if r['context'] == ctx):.3f}"
        for ctx in contexts))
    print()
    # Per-layer attention metrics at the longest context, for the INT2 family.
    ctx = contexts[-1]
    rows = [r for r in results if r["context"] == ctx]
    layers = len(rows[0]["layer_attention_score_kl"])
    print(f"Per-layer attention-score KL at context {ctx} (layers 0, 5, 10, ...):")
    print()
    picked = list(range(0, layers, 5))
    print("| format | " + " | ".join(f"L{l}" for l in picked) + " |")
    print("|---|" + "---:|" * len(picked))
    for r in rows:
        print(f"| {r['format']} | " +
              " | ".join(f"{r['layer_attention_score_kl'][l]:.1e}" for l in picked) + " |")


if __name__ == "__main__":
    main(sys.argv[1])

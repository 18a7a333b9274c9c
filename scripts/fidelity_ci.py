"""Mean KL with bootstrap confidence intervals over windows, from `kvstrata eval --json` results
(docs/fidelity.md, "Round 2"). Standard library only.

    python3 scripts/fidelity_ci.py [--vs FORMAT[,FORMAT]] [--only FORMAT[,FORMAT]] RESULTS.json ...

Results of the same context from several files are paired only when they ran on the same
windows (same context and window count: MakeWindows is deterministic).

Every window of a context scores the same number of positions, so the mean KL of a format is
the mean of its per-window means. The 95 % interval resamples windows with replacement (2,000
draws, fixed seed); for the ratio against a baseline format the draws are paired (the same
windows for both), which cancels most of the window-to-window variation. With one window the
interval is that window's value: read it as "no interval".
"""
import argparse
import json
import random

DRAWS = 2000


def mean(xs):
    return sum(xs) / len(xs)


def interval(values, draws):
    values = sorted(values)
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def bootstrap(windows, baseline=None, seed=19):
    rng = random.Random(seed)
    n = len(windows)
    means, ratios = [], []
    for _ in range(DRAWS):
        pick = [rng.randrange(n) for _ in range(n)]
        m = mean([windows[i] for i in pick])
        means.append(m)
        if baseline is not None:
            b = mean([baseline[i] for i in pick])
            ratios.append(m / b if b > 0 else float("inf"))
    return interval(means, DRAWS), (interval(ratios, DRAWS) if baseline else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs", default="turbo3,oscar")
    ap.add_argument("--only", default="", help="print only these formats")
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    results = []
    for path in args.json:
        with open(path) as f:
            results += json.load(f)["results"]
    baselines = args.vs.split(",")
    contexts = sorted({r["context"] for r in results})
    head = "| format | context | windows | history bits | ΔPPL | KL mean [95% CI] | top-1 |"
    rule = "|---|---:|---:|---:|---:|---|---:|"
    for b in baselines:
        head += f" KL / {b} [95% CI] |"
        rule += "---|"
    print(head)
    print(rule)
    for ctx in contexts:
        at = [r for r in results if r["context"] == ctx]
        by_name = {r["format"]: r for r in at}
        for r in at:
            if args.only and r["format"] not in args.only.split(","):
                continue
            w = r["window_kl"]
            (lo, hi), _ = bootstrap(w)
            line = (f"| {r['format']} | {ctx} | {len(w)} | {r['history_bits_per_element']:.3f} | "
                    f"{100 * r['ppl_change']:+.2f}% | {mean(w):.2e} [{lo:.2e}, {hi:.2e}] | {100 * r['top1']:.2f}% |")
            for b in baselines:
                base = by_name.get(b)
                if base is None or len(base["window_kl"]) != len(w):
                    line += " – |"
                    continue
                _, (rlo, rhi) = bootstrap(w, base["window_kl"])
                line += f" {mean(w) / mean(base['window_kl']):.2f} [{rlo:.2f}, {rhi:.2f}] |"
            print(line)


if __name__ == "__main__":
    main()

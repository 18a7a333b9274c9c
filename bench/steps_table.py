#!/usr/bin/env python3
"""Kernel-round steps side by side: one markdown table per (kernel, shape), µs per layer for
every (batch, context), and each step's time over the default step's from the same run.

    bench/steps_table.py DIR/kvstrata_attention.jsonl

Input: the JSON lines of kvstrata_attention (bench/gpu_session.sh int2 or attention); the
INT2 split decode and the BF16 paged history each get their tables.
"""
import json
import sys

KERNELS = {"kvstrata-int2-split": "INT2", "kvstrata-bf16-paged": "BF16"}


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
    rows = [r for r in rows if r.get("kernel") in KERNELS and "step" in r]
    for kernel, shape in dict.fromkeys((r["kernel"], r["shape"]) for r in rows):
        mine = [r for r in rows if r["kernel"] == kernel and r["shape"] == shape]
        points = list(dict.fromkeys((r["batch"], r["context"]) for r in mine))
        steps = list(dict.fromkeys(r["step"] for r in mine))
        t = {(r["step"], r["batch"], r["context"]): r["us_per_layer"] for r in mine}
        base = next((s for s in steps if s.endswith("(default)")), steps[0])
        print(f"\n{KERNELS[kernel]}, {shape}, µs per layer (and / the default step's, same run)\n")
        print("| step | " + " | ".join(f"b{b} {c // 1024}K" for b, c in points) + " |")
        print("|---|" + "---:|" * len(points))
        for s in steps:
            cells = []
            for b, c in points:
                us, ref = t.get((s, b, c)), t.get((base, b, c))
                if us is None:
                    cells.append("")
                elif s == base or ref is None:
                    cells.append(f"{us:.1f}")
                else:
                    cells.append(f"{us:.1f} ({us / ref:.2f})")
            print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The INT2 history kernel's variants side by side: one markdown table per shape, µs per layer
for every (batch, context), and each variant's time over the default's from the same run.

    bench/int2_steps.py DIR/kvstrata_attention.jsonl

Input: the JSON lines of kvstrata_attention (bench/gpu_session.sh int2 or attention).
"""
import json
import sys


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{\"kernel\": \"kvstrata-int2-split\"")]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        points = list(dict.fromkeys((r["batch"], r["context"]) for r in mine))
        steps = list(dict.fromkeys(r["step"] for r in mine))
        t = {(r["step"], r["batch"], r["context"]): r["us_per_layer"] for r in mine}
        base = next((s for s in steps if s.endswith("(default)")), steps[0])
        print(f"\n{shape}, µs per layer (and / the default step's, same run)\n")
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

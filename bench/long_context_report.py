#!/usr/bin/env python3
"""Markdown tables of the long-context study from its JSON (bench/long_context.sh).

  python3 bench/long_context_report.py docs/data/h200-8b-synthetic

reads long-context-decode.json, long-context-torch.json and long-context-prefill*.json in that
folder and prints the tables docs/benchmarks/engine-gpu.md carries. Gaps are the median step
time minus the kernels CUPTI recorded in the profiled steps of the same point.
"""
import glob
import json
import os
import sys

CATS = ["gemm", "attention", "append_demote", "sampling", "other"]


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/data/h200-8b-synthetic"
    dec = load(os.path.join(d, "long-context-decode.json"))
    torch_path = os.path.join(d, "long-context-torch.json")
    torch = load(torch_path) if os.path.exists(torch_path) else {"results": []}
    fmts = {f["kv_format"].split("-")[0]: f for f in dec["formats"]}
    int2, bf16 = fmts["int2"], fmts["bf16"]
    pts = lambda f: {(p["context"], p["batch"]): p for p in f["decode"]}
    i2, b16 = pts(int2), pts(bf16)
    tr = {(r["context"], r["batch"]): r for r in torch["results"]}
    print(f"Device: {dec['device']}, copy bandwidth {dec['copy_tb_per_s']:.2f} TB/s; "
          f"weights {int2['weight_gb']:.1f} GB BF16 (synthetic)\n")
    print("| context | batch | INT2 step ms | INT2 floor ms | INT2 / floor | BF16 step ms | "
          "BF16 floor ms | torch step ms | INT2 speed-up vs BF16 | vs torch |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ms(p):
        return f"{p['step_ms']:.2f}" if p and "step_ms" in p else "—"

    for key in sorted(i2):
        a, b, t = i2[key], b16.get(key), tr.get(key)
        sb = f"{b['step_ms'] / a['step_ms']:.2f}x" if b and "step_ms" in b else "—"
        st = f"{t['step_ms'] / a['step_ms']:.2f}x" if t and "step_ms" in t else "—"
        bf = f"{b['floor_ms']:.2f}" if b and "floor_ms" in b else "—"
        print(f"| {key[0]:,} | {key[1]} | {a['step_ms']:.2f} | {a['floor_ms']:.2f} | "
              f"{a['step_ms'] / a['floor_ms']:.2f} | {ms(b)} | {bf} | {ms(t)} | {sb} | {st} |")
    print("\nBreakdown of the INT2 step (ms per step, CUPTI):\n")
    print("| context | batch | GEMMs | attention | append + demotion | sampling | other kernels | "
          "gaps | KV GB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(i2):
        a = i2[key]
        bd = a.get("breakdown_ms", {})
        kernels = sum(bd.get(c, 0) for c in CATS)
        gaps = max(0.0, a["step_ms"] - kernels)
        print(f"| {key[0]:,} | {key[1]} | " +
              " | ".join(f"{bd.get(c, 0):.2f}" for c in CATS) + f" | {gaps:.2f} | {a['kv_gb']:.1f} |")
    print("\nSame KV memory (the most sequences of the context that fit in "
          f"{dec['kv_cache_gb']:.0f} GB of pages):\n")
    print("| format | context | sequences | step ms | generated tok/s | step / floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, f in (("INT2", int2), ("BF16", bf16)):
        p = f.get("same_memory")
        if p:
            print(f"| {name} | {p['context']:,} | {p['batch']} | {p['step_ms']:.2f} | "
                  f"{p['tokens_per_s']:.0f} | {p['step_ms'] / p['floor_ms']:.2f} |")
    if int2.get("same_memory") and bf16.get("same_memory"):
        print(f"\nSame-memory throughput, INT2 / BF16: "
              f"{int2['same_memory']['tokens_per_s'] / bf16['same_memory']['tokens_per_s']:.1f}x")
    rows = {}
    for path in sorted(glob.glob(os.path.join(d, "long-context-prefill*.json"))):
        for f in load(path)["formats"]:
            for p in f.get("prefill", []):
                rows.setdefault(p["prompt_tokens"], {})[f["kv_format"].split("-")[0]] = p
    if rows:
        print("\nPrefill of one prompt (chunks of 512, time to first token):\n")
        print("| prompt | INT2 TTFT s | INT2 tok/s | BF16 TTFT s | BF16 tok/s | INT2 / BF16 time |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in sorted(rows):
            a, b = rows[n].get("int2"), rows[n].get("bf16")
            if a and b:
                print(f"| {n:,} | {a['ttft_s']:.2f} | {a['tokens_per_s']:.0f} | {b['ttft_s']:.2f} | "
                      f"{b['tokens_per_s']:.0f} | {a['ttft_s'] / b['ttft_s']:.2f}x |")


if __name__ == "__main__":
    main()

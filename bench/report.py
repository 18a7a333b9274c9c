#!/usr/bin/env python3
"""Turns the JSON lines of bench/run_gpu_bench.sh into the markdown tables of docs/benchmarks.md.

    bench/report.py DIR    (DIR holds kvstrata_attention.jsonl and torch_attention.jsonl)
"""
import json
import pathlib
import sys


def load(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main():
    d = pathlib.Path(sys.argv[1])
    ours = load(d / "kvstrata_attention.jsonl")
    torch = load(d / "torch_attention.jsonl")
    info = next(r for r in ours if "device" in r)
    best = {}
    for r in torch:
        if "us_per_layer" not in r:
            continue
        key = (r["batch"], r["context"])
        best.setdefault(key, {})[r["kernel"]] = r
    print(f"Device: {info['device']}, {info['sms']} SMs, L2 {info['l2_bytes'] / 1e6:.0f} MB; "
          f"device-to-device copy measured in the same run: {info['copy_tb_per_s']:.2f} TB/s "
          "(read + write).\n")
    print("| batch | context | kvstrata INT2 split | bytes read | bandwidth | history kernel alone | "
          "cuDNN BF16 | flash BF16 | speed-up vs best BF16 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in ours:
        if "batch" not in r:
            continue
        key = (r["batch"], r["context"])
        t = best.get(key, {})
        cudnn = t.get("torch-cudnn_attention", {}).get("us_per_layer")
        flash = t.get("torch-flash_attention", {}).get("us_per_layer")
        candidates = [x for x in (cudnn, flash) if x]
        speedup = min(candidates) / r["us_per_layer"] if candidates else float("nan")
        fmt = lambda x: f"{x:.1f} µs" if x else "n/a"
        print(f"| {r['batch']} | {r['context'] // 1024}K | {r['us_per_layer']:.1f} µs | "
              f"{r['bytes_per_layer'] / 1e6:.1f} MB | {r['tb_per_s']:.2f} TB/s "
              f"({100 * r['tb_per_s'] / info['copy_tb_per_s']:.0f}%) | "
              f"{r['history_only_us_per_layer']:.1f} µs, {r['history_only_tb_per_s']:.2f} TB/s | "
              f"{fmt(cudnn)} | {fmt(flash)} | **{speedup:.2f}x** |")
    print("\n| batch | append (36 layers, one launch) per decode step | demotion of one page per "
          "sequence (36 layers) | demotion amortised per step (every 64 steps) |")
    print("|---:|---:|---:|---:|")
    seen = set()
    for r in ours:
        if "batch" not in r or r["batch"] in seen:
            continue
        seen.add(r["batch"])
        print(f"| {r['batch']} | {r['append_us_per_step']:.1f} µs | {r['demote_us_per_page_batch']:.0f} µs | "
              f"{r['demote_us_per_step_amortised']:.1f} µs |")


if __name__ == "__main__":
    main()

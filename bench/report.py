#!/usr/bin/env python3
"""Turns the JSON lines of bench/gpu_session.sh attention (or bench/run_gpu_bench.sh) into the
markdown tables of docs/benchmarks/attention.md.

    bench/report.py DIR [INT2_STEP]
    bench/report.py DIR --steps

DIR holds kvstrata_attention.jsonl and torch_attention.jsonl. The first table of each shape
shows the rows labelled "(default)", or for INT2 the step whose label contains INT2_STEP; the
second, every step of the kernel round side by side, each with its time over its kernel's
default step of the same run. --steps prints only the second (torch_attention.jsonl may then
be absent: bench/gpu_session.sh int2).
"""
import json
import pathlib
import sys

SHAPES = {"qwen3-8b": "Qwen3-8B (32 query / 8 KV heads, head_dim 128)",
          "smollm2-135m": "SmolLM2-135M, the default model (9 query / 3 KV heads, head_dim 64)"}


def load(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


ARGS = [a for a in sys.argv[1:] if a != "--steps"]
STEPS_ONLY = "--steps" in sys.argv[1:]
INT2_STEP = ARGS[1] if len(ARGS) > 1 else None


def is_default(r):
    step = r.get("step", "")
    if INT2_STEP and r.get("kernel") == "kvstrata-int2-split":
        return INT2_STEP in step
    return step.endswith("(default)")


def main():
    d = pathlib.Path(ARGS[0])
    ours = load(d / "kvstrata_attention.jsonl")
    torch = load(d / "torch_attention.jsonl") if not STEPS_ONLY else []
    info = next(r for r in ours if "device" in r)
    copy = info["copy_tb_per_s"]
    base = {}
    for r in torch:
        if "us_per_layer" in r:
            base.setdefault((r.get("shape", "qwen3-8b"), r["batch"], r["context"]), {})[r["kernel"]] = r
    fmt = lambda x: f"{x:.1f} µs" if x else "n/a"
    ctx = lambda c: f"{c // 1024}K"

    def torch_us(shape, r, kernel):
        return base.get((shape, r["batch"], r["context"]), {}).get(kernel, {}).get("us_per_layer")

    print(f"Device: {info['device']}, {info['sms']} SMs, L2 {info['l2_bytes'] / 1e6:.0f} MB; "
          f"device-to-device copy measured in the same run: {copy:.2f} TB/s (read + write).\n")
    history = {(r["shape"], r["batch"], r["context"]): r for r in ours
               if r.get("kernel") == "kvstrata-int2-history-only"}
    for shape, title in SHAPES.items():
        rows = [r for r in ours if r.get("shape") == shape and is_default(r)]
        if not any(r.get("shape") == shape and "step" in r for r in ours):
            continue
        print(f"#### {title}\n")
        if not STEPS_ONLY:
            print("| batch | context | INT2 split | bandwidth | BF16 paged (ours) | cuDNN BF16 | "
                  "flash BF16 | INT2 vs best torch | our BF16 vs cuDNN |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        bf16 = {(r["batch"], r["context"]): r for r in rows if r["kernel"] == "kvstrata-bf16-paged"}
        for r in [] if STEPS_ONLY else rows:
            if r["kernel"] != "kvstrata-int2-split":
                continue
            cudnn = torch_us(shape, r, "torch-cudnn_attention")
            flash = torch_us(shape, r, "torch-flash_attention")
            best = min([x for x in (cudnn, flash) if x] or [float("nan")])
            b = bf16.get((r["batch"], r["context"]))
            ours_bf16 = b["us_per_layer"] if b else None
            bf16_ratio = f"{cudnn / ours_bf16:.2f}x" if cudnn and ours_bf16 else "n/a"
            bw = (f"{ours_bf16 and b['tb_per_s']:.2f} TB/s" if b else "")
            print(f"| {r['batch']} | {ctx(r['context'])} | {r['us_per_layer']:.1f} µs | "
                  f"{r['tb_per_s']:.2f} TB/s ({100 * r['tb_per_s'] / copy:.0f}%) | "
                  f"{fmt(ours_bf16)} ({bw}) | {fmt(cudnn)} | {fmt(flash)} | "
                  f"**{best / r['us_per_layer']:.2f}x** | {bf16_ratio} |")
        if not STEPS_ONLY:
            print()
        steps = [r for r in ours if r.get("shape") == shape and "step" in r]
        names = []
        for r in steps:
            if (r["kernel"], r["step"]) not in names:
                names.append((r["kernel"], r["step"]))
        keys = sorted({(r["batch"], r["context"]) for r in steps})
        print("| kernel | step | " + " | ".join(f"b{b} {ctx(c)}" for b, c in keys) + " |")
        print("|---|---|" + "---:|" * len(keys))
        at = {(r["kernel"], r["step"], r["batch"], r["context"]): r for r in steps}
        defaults = {k: s for k, s in names if s.endswith("(default)")}
        for kernel, step in names:
            cells = []
            for b, c in keys:
                r = at.get((kernel, step, b, c))
                ref = at.get((kernel, defaults.get(kernel), b, c))
                if not r:
                    cells.append("")
                elif ref and step != defaults.get(kernel):
                    cells.append(f"{r['us_per_layer']:.1f} ({r['us_per_layer'] / ref['us_per_layer']:.2f})")
                else:
                    cells.append(f"{r['us_per_layer']:.1f}")
            label = "INT2" if "int2" in kernel else "BF16"
            print(f"| {label} | {step} | " + " | ".join(cells) + " |")
        print()
        if not STEPS_ONLY and any(k[0] == shape for k in history):
            print("| batch | context | INT2 history kernel + merge alone | append (all layers) per "
                  "step | demotion of one page per sequence | demotion amortised per step |")
            print("|---:|---:|---:|---:|---:|---:|")
            for (s, b, c), r in sorted(history.items()):
                if s != shape:
                    continue
                print(f"| {b} | {ctx(c)} | {r['history_only_us_per_layer']:.1f} µs, "
                      f"{r['history_only_tb_per_s']:.2f} TB/s | {r['append_us_per_step']:.1f} µs | "
                      f"{r['demote_us_per_page_batch']:.0f} µs | "
                      f"{r['demote_us_per_step_amortised']:.1f} µs |")
            print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How the split decode's operand rounding shows in its output, for a codec history.

The GPU decodes codec pages into 16-bit tensor-core operands. This emulates, on the CPU, each
way of rounding them on data shaped like tests/kernels/split_decode_gpu_test.cc's codec cases
(rows of different norms and channels of different sizes, coded on the 2-bit Gaussian Lloyd-Max
levels) and prints the worst error of the attention output against fp64 on the exact decoded
values, as a fraction of the row's largest |o| (the test's measure):

  exact K/V, bf16 P            what the INT2 and BF16 kernels round (their K and V are exact)
  bf16 values                  the decoded values s·ρ·L rounded to bf16, q and P in bf16
  fp16 values                  the same in fp16 (SplitDecodeVariant::codec_page_tables off)
  fp16 tables, scales apart    ρ·L in fp16, the row scale s applied to the score and to P
                               before P's rounding (codec_page_tables, the default)

  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy==2.4.6
  /tmp/venv/bin/python bench/codec_rounding.py
"""
import numpy as np

rng = np.random.default_rng(1)
LEVELS = np.array([-1.5104, -0.4528, 0.4528, 1.5104], np.float32)


def bf16(x):
    u = np.asarray(x, np.float32).copy().view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def quantise(x):
    """Each row's RMS and the nearest level per value: (values, levels, scales)."""
    s = np.sqrt((x**2).mean(1, keepdims=True))
    code = np.abs(x[..., None] / s[..., None] - LEVELS).argmin(-1)
    return LEVELS[code] * s, LEVELS[code], s


def worst(d, heads, tokens, mode):
    q = bf16(rng.normal(0, 1.5, (heads, d)))
    r = rng.uniform(0.5, 1.5, (tokens, 1))
    channel = np.where(np.arange(d) < d // 4, 1.5, 0.75)
    k, k_levels, k_scale = quantise((rng.normal(0, 1.5, (tokens, d)) + 0.3) * r * channel)
    v, v_levels, v_scale = quantise(rng.normal(0, 1, (tokens, d)) * r * channel)
    sm = 1 / np.sqrt(d)
    s = (q.astype(np.float64) @ k.T) * sm
    p = np.exp(s - s.max(1, keepdims=True))
    want = (p @ v) / p.sum(1, keepdims=True)
    if mode == "exact K/V, bf16 P":
        s = (q @ k.T) * sm
        p = np.exp(s - s.max(1, keepdims=True))
        got = (bf16(p) @ v) / p.sum(1, keepdims=True)
    elif mode in ("bf16 values", "fp16 values"):
        rnd = bf16 if mode == "bf16 values" else fp16
        s = (rnd(q) @ rnd(k).T) * sm
        p = np.exp(s - s.max(1, keepdims=True))
        got = (rnd(p) @ rnd(v)) / p.sum(1, keepdims=True)
    else:  # fp16 tables, scales apart
        s = (fp16(q) @ fp16(k_levels).T) * k_scale.T * sm
        p = np.exp(s - s.max(1, keepdims=True))
        got = (fp16(p * v_scale.T) @ fp16(v_levels)) / p.sum(1, keepdims=True)
    scale = np.maximum(np.abs(want).max(1, keepdims=True), 1e-3)
    return float((np.abs(got - want) / scale).max())


if __name__ == "__main__":
    for mode in ("exact K/V, bf16 P", "bf16 values", "fp16 values", "fp16 tables, scales apart"):
        w = max(worst(d, heads, tokens, mode) for d in (64, 128) for heads in (1, 3, 4, 8)
                for tokens in (320, 2368, 12800) for _ in range(3))
        print(f"{mode:28s} worst {w:.4f} of the row's max |o|")

#!/usr/bin/env python3
"""How the query's precision shows in an INT2 split decode's output, on the CPU.

The INT2 history kernel scores K codes against the query on fp16 tensor cores (q' = q / 4^p in
fp16). Integer mma on the codes widened to int8 would take the query in int8. This emulates, on
synthetic data (8,192 tokens, head_dim 128, 4 query heads, a few key channels three times wider
than the rest, keys on 2-bit uniform levels with a per-token scale and offset), the attention
output with the query in fp16, in one int8 term (one scale per head: absmax / 127), and in two
int8 terms (the remainder of the first quantised again at 1/127 of its scale), and prints the
worst error against fp32 on the same INT2 keys, as a fraction of the row's largest |o| (the GPU
test's measure, docs/benchmarks/attention.md round 7):

  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy==2.4.6
  /tmp/venv/bin/python bench/int8_query_precision.py
"""
import numpy as np

rng = np.random.default_rng(7)
D, T, H = 128, 8192, 4


def attention(q, k, v):
    s = (q @ k.T) / np.sqrt(D)
    s -= s.max(1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(1, keepdims=True)
    return p @ v


def worst_errors(q_std, trials=20):
    worst = {"fp16": 0.0, "int8": 0.0, "two int8 terms": 0.0}
    for _ in range(trials):
        k = rng.standard_normal((T, D)).astype(np.float32)
        k[:, :4] *= 3
        v = rng.standard_normal((T, D)).astype(np.float32)
        lo, hi = k.min(1, keepdims=True), k.max(1, keepdims=True)
        scale = (hi - lo) / 3
        k_int2 = np.clip(np.round((k - lo) / scale), 0, 3) * scale + lo
        q = (rng.standard_normal((H, D)) * q_std).astype(np.float32)
        ref = attention(q, k_int2, v)
        row_max = np.abs(ref).max(1, keepdims=True)
        s1 = np.abs(q).max(1, keepdims=True) / 127
        hi8 = np.round(q / s1)
        lo8 = np.clip(np.round((q - hi8 * s1) / (s1 / 127)), -127, 127)
        queries = {
            "fp16": q.astype(np.float16).astype(np.float32),
            "int8": hi8 * s1,
            "two int8 terms": hi8 * s1 + lo8 * (s1 / 127),
        }
        for name, qq in queries.items():
            err = (np.abs(attention(qq, k_int2, v) - ref) / row_max).max()
            worst[name] = max(worst[name], err)
    return worst


for q_std in (1.0, 3.0):
    w = worst_errors(q_std)
    print(f"query std {q_std}: worst error of the row's max |o|: " +
          ", ".join(f"{name} {e:.5f}" for name, e in w.items()))

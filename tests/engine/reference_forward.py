#!/usr/bin/env python3
"""Independent reference forward pass for the engine's logits check.

Reads a GGUF Llama-family model with the `gguf` package (its own dequantisation), runs a plain
numpy float32 forward pass with the BF16 KV cache semantics (keys after RoPE and values rounded
to bfloat16, nothing else rounded), and writes the logits of every position.

    reference_forward.py [--fp32-kv] MODEL.gguf OUT.f32 TOKEN [TOKEN ...] [-- TOKEN ...]

Each "--" starts another, independent sequence (the model is read and dequantised once).
OUT.f32 receives float32 little-endian logits, [total tokens][vocab], the sequences' rows in
order. --fp32-kv keeps keys and values in float32 instead (a deliberately different semantics,
for checking that a comparison can tell the two apart). Written from the GGUF
conventions (row-major [out][in] matrices; "llama" files carry q/k rows permuted for RoPE on
adjacent channel pairs; qwen2/qwen3 rotate the two halves of each head), not from the C++ code.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def tensors(reader):
    out = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists ne0 (contiguous) first
        out[t.name] = values.reshape(shape)
    return out


def to_bf16(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def rms_norm(x, w, eps):
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps).astype(np.float32) * w


def rope(x, positions, theta, interleaved):
    # x: [tokens, heads, dim]
    dim = x.shape[-1]
    freqs = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[:, None].astype(np.float64) * freqs[None, :]
    cos = np.cos(angles)[:, None, :].astype(np.float32)
    sin = np.sin(angles)[:, None, :].astype(np.float32)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : dim // 2], x[..., dim // 2:]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : dim // 2], out[..., dim // 2:] = ra, rb
    return out


def main():
    args = sys.argv[1:]
    fp32_kv = "--fp32-kv" in args
    args = [a for a in args if a != "--fp32-kv"]
    if len(args) < 3:
        sys.exit(__doc__)
    model_path, out_path = args[0], args[1]
    sequences = [[]]
    for a in args[2:]:
        if a == "--":
            sequences.append([])
        else:
            sequences[-1].append(int(a))
    if any(not s for s in sequences):
        sys.exit("reference_forward.py: every sequence needs at least one token")
    reader = GGUFReader(model_path)
    arch = field(reader, "general.architecture")
    n_layers = int(field(reader, f"{arch}.block_count"))
    n_heads = int(field(reader, f"{arch}.attention.head_count"))
    n_kv = int(field(reader, f"{arch}.attention.head_count_kv", n_heads))
    hidden = int(field(reader, f"{arch}.embedding_length"))
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // n_heads))
    eps = float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
    theta = float(field(reader, f"{arch}.rope.freq_base", 10000.0))
    interleaved = arch == "llama"
    if arch not in ("llama", "qwen2", "qwen3"):
        sys.exit(f"reference_forward.py: unsupported architecture {arch}")
    config = dict(n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, head_dim=head_dim, eps=eps,
                  theta=theta, interleaved=interleaved, fp32_kv=fp32_kv)
    w = tensors(reader)
    with open(out_path, "wb") as out:
        for s in sequences:
            forward(w, np.array(s, dtype=np.int64), **config).astype("<f4").tofile(out)


def forward(w, tokens, n_layers, n_heads, n_kv, head_dim, eps, theta, interleaved, fp32_kv):
    """Logits [len(tokens)][vocab] of one sequence."""
    round_kv = (lambda a: a) if fp32_kv else to_bf16
    n = len(tokens)
    positions = np.arange(n)
    x = w["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    group = n_heads // n_kv
    for i in range(n_layers):
        p = f"blk.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = h @ w[p + "attn_q.weight"].T
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T
        if p + "attn_q.bias" in w:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q = q.reshape(n, n_heads, head_dim)
        k = k.reshape(n, n_kv, head_dim)
        v = v.reshape(n, n_kv, head_dim)
        if p + "attn_q_norm.weight" in w:
            q = rms_norm(q, w[p + "attn_q_norm.weight"], eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], eps)
        q = rope(q, positions, theta, interleaved)
        k = round_kv(rope(k, positions, theta, interleaved))
        v = round_kv(v)
        out = np.empty((n, n_heads, head_dim), dtype=np.float32)
        for hq in range(n_heads):
            kv = hq // group
            scores = (q[:, hq, :] @ k[:, kv, :].T) / np.float32(np.sqrt(head_dim)) + mask
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, hq, :] = probs @ v[:, kv, :]
        x = x + out.reshape(n, n_heads * head_dim) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        gate = h @ w[p + "ffn_gate.weight"].T
        up = h @ w[p + "ffn_up.weight"].T
        with np.errstate(over="ignore"):  # exp(-gate) = inf for very negative gates: silu -> -0
            silu = gate / (1.0 + np.exp(-gate))
        x = x + (silu * up) @ w[p + "ffn_down.weight"].T
    h = rms_norm(x, w["output_norm.weight"], eps)
    head = w.get("output.weight", w["token_embd.weight"])
    return h @ head.T


if __name__ == "__main__":
    main()

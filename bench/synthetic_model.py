#!/usr/bin/env python3
"""Writes a model with synthetic weights in a Qwen3 shape, as a Hugging Face folder.

The 8B benchmarks (bench/long_context.sh) need a model of Qwen3-8B's shape on the GPU machine,
which cannot download one and to which nothing of 16 GB can be sent. This script writes it there:

  bench/synthetic_model.py --out /tmp/qwen3-8b-synthetic             # Qwen3-8B's shape
  bench/synthetic_model.py --out /tmp/tiny --preset tiny             # 2 layers, for a quick check

The folder holds config.json (Qwen3ForCausalLM), model-0000N-of-0000M.safetensors (BF16, with
model.safetensors.index.json), tokenizer.json and tokenizer_config.json, and loads with kvstrata's
LoadHfModel and with transformers' from_pretrained alike.

Weights: every matrix is normal(0, --std) from a generator seeded with --seed, one stream per
tensor (the tensor's index in the file order is added to the seed), norm gains are 1. With torch
present the numbers come from torch's Philox generator on the GPU (or its CPU generator), else
from numpy's PCG64: the same seed gives the same weights on the same generator only. These are
*synthetic weights*: the figures measured with them are speeds, never quality.

The tokenizer is byte-level BPE with the 256 byte tokens and no merges, then <|endoftext|>,
<|im_start|> and <|im_end|> (eos); the rest of the vocabulary has no text. Benchmarks feed token
ids directly.

max_position_embeddings is 139,264 (Qwen3-8B's is 40,960 with YaRN beyond) so that 128K-token
contexts fit; rope_theta is the real model's 1,000,000. No rope_scaling.
"""
import argparse
import json
import os
import struct
import sys
import time

PRESETS = {
    # Qwen3-8B: https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (shape only)
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                     vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024,
                 tie_word_embeddings=False),
}


def byte_unicode():
    """GPT-2's byte-to-unicode alphabet: byte b is spelled as this character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_files(out):
    alphabet = byte_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
        added.append({"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "model_max_length": 139264, "tokenizer_class": "Qwen2Tokenizer"}, f)
    return 256 + len(specials)


def tensor_list(c):
    """(name, shape, is_norm) in the order written."""
    H, d = c["hidden_size"], c["head_dim"]
    q, kv, inter = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, \
        c["intermediate_size"]
    out = [("model.embed_tokens.weight", (c["vocab_size"], H), False)]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (H,), True),
                (p + "self_attn.q_proj.weight", (q, H), False),
                (p + "self_attn.k_proj.weight", (kv, H), False),
                (p + "self_attn.v_proj.weight", (kv, H), False),
                (p + "self_attn.q_norm.weight", (d,), True),
                (p + "self_attn.k_norm.weight", (d,), True),
                (p + "self_attn.o_proj.weight", (H, q), False),
                (p + "post_attention_layernorm.weight", (H,), True),
                (p + "mlp.gate_proj.weight", (inter, H), False),
                (p + "mlp.up_proj.weight", (inter, H), False),
                (p + "mlp.down_proj.weight", (H, inter), False)]
    out.append(("model.norm.weight", (H,), True))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (c["vocab_size"], H), False))
    return out


class Generator:
    """BF16 bytes of normal(0, std) tensors, one seeded stream per tensor."""

    def __init__(self, seed, std):
        self.seed, self.std = seed, std
        try:
            import torch
            self.torch = torch
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.name = f"torch {torch.__version__} Philox/{self.device}"
        except ImportError:
            import numpy
            self.torch, self.np = None, numpy
            self.name = f"numpy {numpy.__version__} PCG64"

    def bf16_bytes(self, index, shape, is_norm):
        n = 1
        for s in shape:
            n *= s
        if self.torch is not None:
            t = self.torch
            if is_norm:
                x = t.ones(n, dtype=t.bfloat16)
            else:
                g = t.Generator(device=self.device).manual_seed(self.seed + index)
                x = t.randn(n, generator=g, device=self.device, dtype=t.float32)
                x = (x * self.std).to(t.bfloat16).cpu()
            return x.view(t.int16).numpy().tobytes()
        np = self.np
        if is_norm:
            x = np.ones(n, dtype=np.float32)
        else:
            rng = np.random.Generator(np.random.PCG64(self.seed + index))
            x = rng.standard_normal(n, dtype=np.float32) * np.float32(self.std)
        u = x.view(np.uint32)
        # round to nearest even, as a float -> bfloat16 conversion does
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype(np.uint16).tobytes()


def write_shard(path, entries):
    """entries: [(name, shape, bytes)]; a safetensors file, BF16."""
    header, offset = {}, 0
    for name, shape, data in entries:
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, data in entries:
            f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", required=True, help="folder to write (created)")
    ap.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--std", type=float, default=0.02, help="standard deviation of the matrices")
    ap.add_argument("--shard-gb", type=float, default=4.0, help="safetensors shard size")
    a = ap.parse_args()

    c = dict(PRESETS[a.preset])
    c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
             max_position_embeddings=139264, rope_theta=1000000.0, rms_norm_eps=1e-6,
             attention_bias=False, torch_dtype="bfloat16", bos_token_id=256, eos_token_id=258,
             kvstrata_synthetic={"seed": a.seed, "std": a.std, "preset": a.preset})
    os.makedirs(a.out, exist_ok=True)
    if tokenizer_files(a.out) > c["vocab_size"]:
        sys.exit("synthetic_model: the vocabulary is smaller than the tokenizer")
    gen = Generator(a.seed, a.std)
    c["kvstrata_synthetic"]["generator"] = gen.name
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)

    tensors = tensor_list(c)
    total = sum(2 * _numel(s) for _, s, _ in tensors)
    limit = int(a.shard_gb * (1 << 30))
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        b = 2 * _numel(t[1])
        if cur and cur_bytes + b > limit:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += b
    shards.append(cur)
    weight_map, done, start = {}, 0, time.time()
    print(f"synthetic_model: {a.preset}, {total / 1e9:.1f} GB BF16 in {len(shards)} shard(s), "
          f"{gen.name}, seed {a.seed}", file=sys.stderr)
    index = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        entries = []
        for name, shape, is_norm in shard:
            entries.append((name, shape, gen.bf16_bytes(index, shape, is_norm)))
            weight_map[name] = fname
            index += 1
        write_shard(os.path.join(a.out, fname), entries)
        done += sum(len(e[2]) for e in entries)
        print(f"  {fname}: {done / 1e9:.1f}/{total / 1e9:.1f} GB, {time.time() - start:.0f} s",
              file=sys.stderr)
        del entries
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    main()

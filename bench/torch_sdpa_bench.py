#!/usr/bin/env python3
"""BF16 decode attention through torch's scaled_dot_product_attention, the baseline kvstrata's
INT2 split kernel is compared with (bench/run_gpu_bench.sh runs both in one call).

Same shapes as kvstrata_bench_attention: Qwen3-8B's (32 query / 8 KV heads, head_dim 128) and the
default model's (9 query / 3 KV heads, head_dim 64), one query token per sequence, GQA through
enable_gqa. Each backend's calls for several distinct layers' K/V
buffers (>= 36 where memory allows, and always far beyond the 60 MB L2) are captured in one CUDA
graph and replayed; time per layer. One JSON object per line.
"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


SHAPES = {"qwen3-8b": (32, 8, 128), "smollm2-135m": (9, 3, 64)}


def run(shape, batch, context, backend, iters, budget_bytes):
    heads, kv_heads, d = SHAPES[shape]
    per_layer = batch * kv_heads * context * d * 2 * 2  # K and V, bf16
    layers = int(max(2, min(36, budget_bytes // per_layer)))
    ks = [torch.randn(batch, kv_heads, context, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    vs = [torch.randn(batch, kv_heads, context, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    q = torch.randn(batch, heads, 1, d, device="cuda", dtype=torch.bfloat16)
    outs = [None] * layers
    with sdpa_kernel([backend]):
        def step():
            for i in range(layers):
                outs[i] = F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=True)
        try:
            step()
        except RuntimeError as e:
            return {"kernel": f"torch-{backend.name.lower()}", "shape": shape, "batch": batch,
                    "context": context, "error": str(e).splitlines()[0][:200]}
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / (iters * layers)
    del ks, vs, graph
    torch.cuda.empty_cache()
    return {"kernel": f"torch-{backend.name.lower()}", "shape": shape, "batch": batch,
            "context": context, "us_per_layer": round(us, 2), "bytes_per_layer": per_layer,
            "tb_per_s": round(per_layer / (us * 1e-6) / 1e12, 3), "distinct_layers": layers}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,32768,65536,102400,131072")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--budget-gb", type=float, default=60.0, help="K/V memory per shape")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of " + ", ".join(SHAPES))
    args = parser.parse_args()
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    for shape in args.shapes.split(","):
        for batch in map(int, args.batches.split(",")):
            for context in map(int, args.contexts.split(",")):
                for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                    print(json.dumps(run(shape, batch, context, backend, args.iters,
                                         args.budget_gb * 1e9)), flush=True)


if __name__ == "__main__":
    main()

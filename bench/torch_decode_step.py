#!/usr/bin/env python3
"""Decode-step time of the same model in torch/transformers, static BF16 cache and SDPA.

The external implementation beside kvstrata's BF16 path in the long-context study
(bench/long_context.sh): transformers' own Qwen3 modules, loaded from the folder
bench/synthetic_model.py writes, decoding one token per sequence against a StaticCache of
`context` positions whose keys and values are random (as kvstrata's are synthetic there), with
torch's SDPA preferring cuDNN, then flash, then memory-efficient attention. Each step is
captured once as a CUDA graph when capture works, and launched eagerly otherwise; the mode used
is in the JSON. Every timed step decodes at the same position (the cache is not advanced), so
all steps read exactly `context` + 1 positions (transformers' StaticCache writes each new token
at its running count, which stays far below `context`).

  python3 bench/torch_decode_step.py --model /tmp/qwen3-8b-synthetic --json torch.json

Uses the torch and transformers of the machine it runs on (their versions are in the JSON).
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="8192,32768,65536,102400,131072")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--memory-gb", type=float, default=100.0,
                    help="largest BF16 KV cache to allocate, GB")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModelForCausalLM, StaticCache

    dev = torch.device(a.device)
    dtype = torch.bfloat16
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype,
                                                 attn_implementation="sdpa").to(dev).eval()
    cfg = model.config
    print(f"torch_decode_step: {cfg.num_hidden_layers} layers loaded in {time.time() - t0:.0f} s "
          f"(torch {torch.__version__}, transformers {transformers.__version__})", file=sys.stderr)
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "steps": a.steps, "results": [],
           "note": "transformers Qwen3 modules, StaticCache BF16 with random K/V, SDPA "
                   "(cuDNN preferred); step = one token per sequence at position `context`"}
    kv_bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def measure(context, batch, row):
        cache = StaticCache(config=cfg, max_cache_len=context + 1)
        ids = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        with torch.no_grad(), sdpa_kernel(backends, set_priority=True):
            # The first call sizes the cache's tensors; then they get random contents.
            model(input_ids=ids, past_key_values=cache,
                  cache_position=torch.zeros(1, dtype=torch.long, device=dev), use_cache=True)
            for layer in cache.layers:
                layer.keys.normal_()
                layer.values.normal_()
            pos = torch.full((1,), context, dtype=torch.long, device=dev)

            def step():
                return model(input_ids=ids, past_key_values=cache, cache_position=pos,
                             use_cache=True).logits[:, -1].argmax(-1)

            # Which attention kernel the priority list lands on: the first that runs alone.
            row["sdpa_backend"] = None
            for b in backends:
                try:
                    with sdpa_kernel([b]):
                        step()
                    sync()
                    row["sdpa_backend"] = b.name
                    break
                except RuntimeError:
                    continue
            for _ in range(3):
                step()
            sync()
            mode, run = "eager", step
            if dev.type == "cuda":
                try:
                    g = torch.cuda.CUDAGraph()
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        step()
                    torch.cuda.current_stream().wait_stream(s)
                    with torch.cuda.graph(g):
                        step()
                    mode, run = "cuda graph", g.replay
                except Exception as e:  # capture is best effort; eager is the fallback
                    print(f"    CUDA graph capture failed ({type(e).__name__}: "
                          f"{str(e)[:120]}); timing eager steps", file=sys.stderr)
                    torch.cuda.synchronize()
            times = []
            for _ in range(a.steps):
                sync()
                t = time.perf_counter()
                run()
                sync()
                times.append(time.perf_counter() - t)
        times.sort()
        row.update(step_ms=1e3 * times[len(times) // 2], mode=mode,
                   tokens_per_s=batch / times[len(times) // 2])
        print(f"  {context:6d} x {batch:2d}: step {row['step_ms']:.3f} ms ({mode}, "
              f"{row['sdpa_backend']}), {row['tokens_per_s']:.0f} tok/s", file=sys.stderr)

    for context in [int(x) for x in a.contexts.split(",")]:
        for batch in [int(x) for x in a.batch_sizes.split(",")]:
            need = kv_bytes_per_token * batch * (context + 1)
            row = {"context": context, "batch": batch, "kv_gb": need / 1e9}
            if need > a.memory_gb * 1e9:
                row["skipped"] = f"the BF16 cache needs {need / 1e9:.0f} GB"
                print(f"  {context:6d} x {batch:2d}: skipped ({row['skipped']})", file=sys.stderr)
            else:
                try:
                    measure(context, batch, row)
                except Exception as e:  # one point's failure is reported, the others still run
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    print(f"  {context:6d} x {batch:2d}: {row['error']}", file=sys.stderr)
            out["results"].append(row)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

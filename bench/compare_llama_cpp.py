#!/usr/bin/env python3
"""kvstrata's CPU engine and llama.cpp side by side: same GGUF file, same prompt tokens, same
thread count, interleaved in one run so both see the same machine.

Run through bench/compare_llama_cpp.sh, which installs the pinned llama-cpp-python in its own
venv. Each round runs, in alternating order:
  * `kvstrata bench-engine` (a child process): every KV format and batch size of the round, each
    with its own warm-up request (docs/benchmarks/cpu.md describes its timing);
  * llama.cpp through llama-cpp-python's low-level API on the token ids bench-engine used (read
    from its JSON), for each batch size and each flash-attention setting: one warm-up, then B
    prompts prefilled one after the other in chunks of 512 tokens (prefill time ends when every
    sequence has its first greedy token), then decode_tokens - 1 steps of one token per
    sequence (greedy, as kvstrata).
tokens/s: prefill = B * prompt_tokens / prefill time, decode = B * (decode_tokens - 1) / decode
time, for both. Other processes only ever slow a run down, so on a shared machine the report
takes each configuration's best round (and shows the median too), and gives kvstrata /
llama.cpp ratios against the faster llama.cpp setting. Each measurement also records how much
CPU other processes used meanwhile (cores, from /proc/stat less this run's own CPU time).
"""

import argparse
import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import llama_cpp


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def busy_seconds():
    """CPU seconds all processes have spent so far (user + nice + system + irq + softirq)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def own_seconds():
    """CPU seconds of this process and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class OtherLoad:
    """Cores other processes kept busy during a `with` block."""

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), busy_seconds(), own_seconds()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        other = (busy_seconds() - self.busy) - (own_seconds() - self.own)
        self.cores = max(0.0, other / wall) if wall > 0 else 0.0


class LlamaCpp:
    """One llama.cpp model with a context per (batch size, flash attention) setting."""

    def __init__(self, model_path, threads, ctx_per_seq):
        llama_cpp.llama_backend_init()
        # llama.cpp logs every load to stderr; keep errors only (GGML_LOG_LEVEL_ERROR = 4).
        def on_log(level, text, data):
            if level == 4:
                sys.stderr.write(text.decode(errors="replace"))
        self._log_cb = llama_cpp.llama_log_callback(on_log)
        llama_cpp.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {model_path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.threads = threads
        self.ctx_per_seq = ctx_per_seq  # KV cells per sequence, for the longest run
        self.contexts = {}

    def context(self, batch, flash_attn):
        key = (batch, flash_attn)
        if key not in self.contexts:
            p = llama_cpp.llama_context_default_params()
            p.n_ctx = batch * self.ctx_per_seq
            p.n_batch = 512
            p.n_ubatch = 512
            p.n_seq_max = batch
            p.kv_unified = False  # one KV stream per sequence: they share nothing
            p.n_threads = self.threads
            p.n_threads_batch = self.threads
            p.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else
                                 llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
            p.no_perf = True
            ctx = llama_cpp.llama_init_from_model(self.model, p)
            if not ctx:
                raise RuntimeError("llama.cpp cannot create a context")
            self.contexts[key] = ctx
        return self.contexts[key]

    def run(self, prompts, decode_tokens, flash_attn):
        """Greedy generation for len(prompts) sequences; returns (prefill s, decode s, tokens)."""
        b = len(prompts)
        ctx = self.context(b, flash_attn)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        batch = llama_cpp.llama_batch_init(max(512, b), 0, 1)
        try:
            def decode(entries):  # [(token, pos, seq, wants_logits)]
                batch.n_tokens = len(entries)
                for i, (tok, pos, seq, want) in enumerate(entries):
                    batch.token[i] = tok
                    batch.pos[i] = pos
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = 1 if want else 0
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")

            def argmax(i):
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i),
                                               shape=(self.n_vocab,))
                return int(np.argmax(logits))

            start = time.perf_counter()
            last = []
            for s, prompt in enumerate(prompts):
                for c in range(0, len(prompt), 512):
                    chunk = prompt[c:c + 512]
                    decode([(t, c + j, s, c + j == len(prompt) - 1) for j, t in enumerate(chunk)])
                last.append(argmax(-1))
            prefilled = time.perf_counter()
            generated = [[t] for t in last]
            for step in range(decode_tokens - 1):
                pos = len(prompts[0]) + step
                decode([(generated[s][-1], pos, s, True) for s in range(b)])
                for s in range(b):
                    generated[s].append(argmax(s))
            end = time.perf_counter()
            return prefilled - start, end - prefilled, generated
        finally:
            llama_cpp.llama_batch_free(batch)


def run_kvstrata(args, batch_sizes):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [args.kvstrata, "bench-engine", "--model", args.model,
               "--prompt-tokens", str(args.prompt_tokens),
               "--decode-tokens", str(args.decode_tokens),
               "--batch-sizes", ",".join(map(str, batch_sizes)),
               "--kv-formats", args.kv_formats, "--kv-cache-mb", str(args.kv_cache_mb),
               "--cpu-threads", str(args.threads), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvstrata", required=True, help="the kvstrata binary")
    ap.add_argument("--model", required=True, help="the GGUF file both engines run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--kv-formats", default="bf16,int2")
    ap.add_argument("--kv-cache-mb", type=int, default=512)
    ap.add_argument("--out", help="write every measurement and the summary as JSON here")
    args = ap.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    llama = LlamaCpp(args.model, args.threads,
                     -(-(args.prompt_tokens + args.decode_tokens) // 256) * 256)
    rows = []  # one per (round, engine, setting, batch)
    prompts = None
    for r in range(args.rounds):
        order = ["kvstrata", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "kvstrata"]
        if prompts is None:  # the first round must learn the prompt tokens from kvstrata
            order = ["kvstrata", "llama.cpp"]
        for engine in order:
            if engine == "kvstrata":
                with OtherLoad() as load:
                    j = run_kvstrata(args, batch_sizes)
                prompts = j["prompt_token_ids"]
                for res in j["results"]:
                    rows.append({"round": r, "engine": "kvstrata", "setting": res["kv_format"],
                                 "batch": res["batch"],
                                 "prefill_tokens_per_s": res["prefill_tokens_per_s"],
                                 "decode_tokens_per_s": res["decode_tokens_per_s"],
                                 "other_load_cores": load.cores})
                    log(f"round {r} kvstrata {res['kv_format']:5} batch {res['batch']}: prefill "
                        f"{res['prefill_tokens_per_s']:7.1f} tok/s, decode "
                        f"{res['decode_tokens_per_s']:6.1f} tok/s (other load "
                        f"{load.cores:.2f} cores)")
                continue
            for b in batch_sizes:
                for fa in (False, True):
                    setting = "flash-attn" if fa else "default"
                    llama.run([p[:64] for p in prompts[:b]], 2, fa)  # warm-up
                    with OtherLoad() as load:
                        pre, dec, _ = llama.run(prompts[:b], args.decode_tokens, fa)
                    row = {"round": r, "engine": "llama.cpp", "setting": setting, "batch": b,
                           "prefill_tokens_per_s": b * len(prompts[0]) / pre,
                           "decode_tokens_per_s": b * (args.decode_tokens - 1) / dec,
                           "other_load_cores": load.cores}
                    rows.append(row)
                    log(f"round {r} llama.cpp {setting:10} batch {b}: prefill "
                        f"{row['prefill_tokens_per_s']:7.1f} tok/s, decode "
                        f"{row['decode_tokens_per_s']:6.1f} tok/s (other load "
                        f"{load.cores:.2f} cores)")

    def values(engine, setting, b, key):
        return [x[key] for x in rows if (x["engine"], x["setting"], x["batch"]) == (engine, setting, b)]

    summary = []
    print(f"{args.prompt_tokens}-token prompts, {args.decode_tokens} generated tokens, "
          f"{args.threads} threads, best (median) of {args.rounds} interleaved rounds")
    print(f"{'engine':10} {'setting':11} {'batch':>5} {'prefill tok/s':>16} {'decode tok/s':>15}"
          f" {'prefill vs llama.cpp':>21} {'decode vs llama.cpp':>20}")
    for b in batch_sizes:
        best = {k: max(max(values("llama.cpp", s, b, k)) for s in ("default", "flash-attn"))
                for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
        for engine, settings in (("llama.cpp", ("default", "flash-attn")),
                                 ("kvstrata", args.kv_formats.split(","))):
            for s in settings:
                pre = values(engine, s, b, "prefill_tokens_per_s")
                dec = values(engine, s, b, "decode_tokens_per_s")
                entry = {"engine": engine, "setting": s, "batch": b,
                         "prefill_tokens_per_s": max(pre), "decode_tokens_per_s": max(dec),
                         "prefill_tokens_per_s_median": statistics.median(pre),
                         "decode_tokens_per_s_median": statistics.median(dec),
                         "prefill_vs_best_llama_cpp": max(pre) / best["prefill_tokens_per_s"],
                         "decode_vs_best_llama_cpp": max(dec) / best["decode_tokens_per_s"]}
                summary.append(entry)
                print(f"{engine:10} {s:11} {b:5d} {max(pre):7.1f} ({statistics.median(pre):6.1f})"
                      f" {max(dec):6.1f} ({statistics.median(dec):6.1f}) "
                      f"{entry['prefill_vs_best_llama_cpp']:20.2f}x "
                      f"{entry['decode_vs_best_llama_cpp']:19.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": {"cpus": os.cpu_count(), "cpu": platform.processor() or
                                   platform.machine(),
                                   "llama_cpp_system_info":
                                       llama_cpp.llama_print_system_info().decode()},
                       "model": os.path.basename(args.model),
                       "llama_cpp_python": llama_cpp.__version__,
                       "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                       "threads": args.threads, "rounds": args.rounds,
                       "summary": summary, "measurements": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

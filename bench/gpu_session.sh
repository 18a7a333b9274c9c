#!/usr/bin/env bash
# The CUDA engine's GPU run, on a machine with a GPU, from the repository root. The default model
# (98 MB) is larger than one transfer to that machine may be, so the run comes in steps that
# share /tmp/kvstrata-gpu on the same (warm) machine:
#
#   here:   scripts/build.sh && bench/gpu_session.sh pack      # .devpack/: binaries, model parts
#   there:  bench/gpu_session.sh kernels   (carry .devpack/bin.tar.xz)
#   there:  bench/gpu_session.sh stage 0   (carry .devpack/model.0; one call per part but the last)
#   there:  bench/gpu_session.sh engine    (carry .devpack/model.N .devpack/model.sha256, N last)
#
# pack prints the calls it needs (KVSTRATA_PACK_EXTRA: more binaries to send, such as a
# benchmark built before a change, to run beside the new one). kernels: unpacks the binaries, keeps the first part of the
# model, runs the kernel GPU tests and the NCCL transport's one-GPU tests. stage: keeps one
# more part.
# gemv:    after kernels: kvstrata_bench_gemv, the decode GEMV's launch variants side by side.
# int2:    after kernels: the INT2 history kernel's variants side by side (in rotated rounds,
#          every step first equally often), and their Nsight Compute counts
#          (KVSTRATA_INT2_STEPS picks them, KVSTRATA_BF16_STEPS adds BF16 history steps,
#          KVSTRATA_INT2_NCU=0 leaves Nsight Compute out; extra arguments go to the benchmark).
# codec:   after kernels: the codec split decode's GPU tests (codec and codec fragment
#          histories), kvstrata_bench_attention's codec steps and codec fragment blocks beside
#          INT2 (KVSTRATA_CODEC_FORMATS, default int2,codec,fragment; and, with KVSTRATA_CODEC_BEFORE naming a benchmark binary sent by
#          KVSTRATA_PACK_EXTRA, the same run of that build after it), then Nsight Compute's counts
#          for the page-table step at batch 1 and 32 / 128K (KVSTRATA_CODEC_NCU=0 leaves them out).
# attention: after kernels, on the same machine: kvstrata_bench_attention (split decode, INT2 and
#          BF16, every step of the kernel round side by side) and bench/torch_sdpa_bench.py
#          (cuDNN and flash on the same shapes), in one call; bench/report.py makes the tables.
# transport: joins the model, runs kvstrata_bench_transport and a cluster whose kvstore keeps
#          pages in an HBM pool beside two GPU workers (carry as for engine).
# engine:  joins the model (checked against its SHA-256), runs the CUDA engine test against the
#          CPU engine, `kvstrata bench-engine --device cuda` (batch 1, 8, 32, both formats), and
#          a local cluster whose two decode workers serve from the GPU (demo-chat through the
#          router). Results under ${OUT:-bench-out}/. KVSTRATA_GPU_TEST_FILTER (a gtest filter)
#          narrows the test, KVSTRATA_GPU_BENCH=0 leaves the benchmarks out,
#          KVSTRATA_GPU_BENCH_RUNS ("WEIGHTS graphs|launches gpu|host;...") and
#          KVSTRATA_GPU_BENCH_FORMATS (bf16,int2,codec) narrow them, KVSTRATA_GPU_CLUSTER=0
#          leaves the cluster out.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: bench/gpu_session.sh pack|kernels|gemv|int2|codec|attention|stage N|engine|transport}
work=/tmp/kvstrata-gpu
out=${OUT:-bench-out}
mkdir -p "$out"

# Joins the model's parts (the last one carried by this call) and checks its SHA-256.
join_model() {
  cp .devpack/model.[0-9]* "$work/"
  cat $(ls "$work"/model.[0-9]* | sort -t. -k2 -n) >"$work/model.gguf"
  if ! echo "$(cat .devpack/model.sha256)  $work/model.gguf" | sha256sum -c --quiet; then
    echo "gpu_session: the joined model does not match its SHA-256" >&2
    return 1
  fi
  export KVSTRATA_MODEL=$work/model.gguf
}

case $step in
  pack)
    model=${KVSTRATA_MODEL:-${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    ../shared/tools/device-pack build/bin/kvstrata build/bin/kvstrata-decode \
      build/bin/kvstrata-router build/bin/kvstrata-kvstore build/bin/kvstrata_bench_transport \
      build/bin/kvstrata_bench_attention build/bin/kvstrata_bench_gemv \
      build/tests/kernels/*_gpu_test build/tests/engine/engine_cuda_gpu_test \
      build/tests/transport/transport_nccl_gpu_test build/tests/services/kvstore_nccl_gpu_test \
      ${KVSTRATA_PACK_EXTRA:-} >/dev/null
    strip -s .device/bin/* 2>/dev/null
    mkdir -p .devpack
    grep -qxF "/.devpack/" .git/info/exclude || echo "/.devpack/" >>.git/info/exclude
    tar cf - -C .device . | xz -T0 -6 >.devpack/bin.tar.xz
    # A transfer to that machine holds 64 MiB, the repository (~22 MB) included: the binaries
    # (~20 MB) travel alone, then the parts one per call (24 MiB, then 36 MiB each).
    rm -f .devpack/model.[0-9]*
    first=$((24 << 20))
    head -c "$first" "$model" >.devpack/model.0
    tail -c +$((first + 1)) "$model" | split -b $((36 << 20)) -d -a 1 --numeric-suffixes=1 - .devpack/model.
    sha256sum "$model" | cut -d' ' -f1 >.devpack/model.sha256
    last=$(ls .devpack/model.[0-9]* | sed 's/.*model\.//' | sort -n | tail -1)
    echo "calls: kernels (carry .devpack/bin.tar.xz)"
    for ((i = 0; i < last; i++)); do echo "       stage $i (carry .devpack/model.$i)"; done
    echo "       engine (carry .devpack/model.$last .devpack/model.sha256)"
    du -sh .devpack/*
    ;;
  kernels)
    rm -rf "$work" && mkdir -p "$work/device"
    tar xJf .devpack/bin.tar.xz -C "$work/device"
    [[ -f .devpack/model.0 ]] && cp .devpack/model.0 "$work/"  # or by `stage 0`
    source "$work/device/env.sh"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
    status=0
    for t in "$work"/device/bin/kernels_*_gpu_test; do
      echo "== $(basename "$t")"
      "$t" 2>&1 | tee -a "$out/kernel_tests.log" |
        grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|append head_dim|split decode:" || true
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
    # NCCL from Python's nvidia-nccl-cu13 wheel there (the transport opens it at run time).
    nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' \
      2>/dev/null || true)
    for t in transport_nccl_gpu_test kvstore_nccl_gpu_test; do
      echo "== $t"
      LD_LIBRARY_PATH="${nccl:+$nccl:}$LD_LIBRARY_PATH" NCCL_DEBUG=WARN "$work/device/bin/$t" 2>&1 |
        tee -a "$out/kernel_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|^\[  FAILED" || true
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
    exit $status
    ;;
  gemv)
    source "$work/device/env.sh"
    kvstrata_bench_gemv "${@:2}" | tee "$out/gemv.jsonl"
    ;;
  attention)
    source "$work/device/env.sh"
    kvstrata_bench_attention "${@:2}" >"$out/kvstrata_attention.jsonl" || exit 1
    python3 bench/torch_sdpa_bench.py >"$out/torch_attention.jsonl" || exit 1
    python3 bench/report.py "$out"
    ;;
  int2)
    # The INT2 history kernel's variants side by side (kvstrata_bench_attention --int2_steps:
    # indices into its kInt2Steps), then Nsight Compute's counts for each at batch 1 and 32 /
    # 128K (instructions, issue rate, resident warps, DRAM), one variant per profiled run.
    source "$work/device/env.sh"
    steps=${KVSTRATA_INT2_STEPS:-17,18}  # the default, not launched early and launched early
    bf16=()  # KVSTRATA_BF16_STEPS: BF16 history steps to run beside them (none by default)
    [[ -n ${KVSTRATA_BF16_STEPS:-} ]] && bf16=(--bf16_steps "$KVSTRATA_BF16_STEPS")
    kvstrata_bench_attention --formats "int2${bf16:+,bf16}" --int2_steps "$steps" "${bf16[@]}" \
      "${@:2}" >"$out/kvstrata_attention.jsonl" || exit 1
    python3 bench/report.py "$out" --steps
    [[ ${KVSTRATA_INT2_NCU:-1} == 1 ]] || exit 0  # KVSTRATA_INT2_NCU=0: the timings alone
    command -v ncu >/dev/null || { echo "no ncu on this machine"; exit 0; }
    metrics=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active
    metrics+=,sm__warps_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
    metrics+=,launch__registers_per_thread,launch__grid_size
    for b in 1 32; do
      for s in ${steps//,/ }; do
        echo "== batch $b, step $s" >>"$out/ncu_int2.txt"
        ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
          --metrics "$metrics" kvstrata_bench_attention --formats int2 --shapes qwen3-8b \
          --batches "$b" --contexts 131072 --iters 2 --rounds 1 --int2_steps "$s" \
          >>"$out/ncu_int2.txt" 2>&1
      done
    done
    grep -E "^== |Int2HistoryKernel<|gpu__time|inst_executed|issue_active|warps_active|dram__|registers|grid_size" \
      "$out/ncu_int2.txt"
    ;;
  codec)
    source "$work/device/env.sh"
    status=0
    kernels_split_decode_gpu_test --gtest_filter='*Codec*' 2>&1 | tee "$out/codec_tests.log" |
      grep -E "^\[  (PASSED|FAILED)|Failure|split decode" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    runs=(kvstrata_bench_attention ${KVSTRATA_CODEC_BEFORE:-})
    for bench in "${runs[@]}"; do
      "$bench" --formats "${KVSTRATA_CODEC_FORMATS:-int2,codec,fragment}" --int2_steps 9 "${@:2}" \
        >"$out/$bench.jsonl" || status=1
    done
    python3 - "$out" "${runs[@]}" <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
for bench in runs:
    rows = [json.loads(l) for l in open(f"{out}/{bench}.jsonl") if l.startswith("{")]
    int2 = {(r["shape"], r["batch"], r["context"]): r["us_per_layer"]
            for r in rows if r.get("kernel") == "kvstrata-int2-split"}
    for r in rows:
        if r.get("kernel") in ("kvstrata-codec-split", "kvstrata-codec-fragment-split"):
            k = (r["shape"], r["batch"], r["context"])
            if k not in int2:  # a build from before INT2 step 9
                print(f"{bench}: {k[0]} b{k[1]} {k[2]}: {r['step'][:40]}: {r['us_per_layer']:.1f} us")
                continue
            print(f"{bench}: {k[0]} b{k[1]} {k[2]}: {r['step'][:40]}: {r['us_per_layer']:.1f} us, "
                  f"{r['us_per_layer'] / int2[k]:.2f}x INT2 ({int2[k]:.1f})")
PY
    [[ ${KVSTRATA_CODEC_NCU:-1} == 1 ]] || exit $status
    command -v ncu >/dev/null || { echo "no ncu on this machine"; exit $status; }
    metrics=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active
    metrics+=,sm__warps_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
    metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,launch__registers_per_thread
    metrics+=,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio
    metrics+=,smsp__average_warp_latency_issue_stalled_barrier.ratio
    for b in 1 32; do
      echo "== batch $b, codec page tables" >>"$out/ncu_codec.txt"
      ncu --clock-control none --kernel-name regex:CodecHistoryKernel --launch-count 1 \
        --metrics "$metrics" kvstrata_bench_attention --formats codec --codec_steps 1 \
        --shapes qwen3-8b --batches "$b" --contexts 131072 --iters 2 --rounds 1 \
        >>"$out/ncu_codec.txt" 2>&1
    done
    grep -E "^== |gpu__time|inst_executed|issue_active|warps_active|dram__|bank|stalled|registers" \
      "$out/ncu_codec.txt"
    exit $status
    ;;
  stage)
    part=${2:?usage: bench/gpu_session.sh stage N}
    cp ".devpack/model.$part" "$work/"
    ;;
  engine)
    source "$work/device/env.sh"
    join_model || exit 1
    status=0
    echo "== engine_cuda_gpu_test"
    engine_cuda_gpu_test --gtest_filter="${KVSTRATA_GPU_TEST_FILTER:-*}" 2>&1 |
      tee "$out/engine_test.log" |
      grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|mean KL|identical|differs|cpu:|gpu:" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    # Side by side in one run: GPU sampling on and off, bf16 weights, kernels launched one by one.
    mkdir -p "$work/json"
    runs=${KVSTRATA_GPU_BENCH_RUNS:-"auto graphs gpu;auto graphs host;bf16 graphs gpu;auto launches gpu"}
    [[ ${KVSTRATA_GPU_BENCH:-1} == 1 ]] && IFS=';' read -ra runs <<<"$runs" && for run in "${runs[@]}"; do
      set -- $run
      echo "== bench-engine --device cuda --gpu-weights $1 ($2, sampling on the $3)"
      kvstrata bench-engine --device cuda --gpu-weights "$1" \
        --cuda-graphs="$([[ $2 == graphs ]] && echo true || echo false)" \
        --gpu-sampling="$([[ $3 == gpu ]] && echo true || echo false)" \
        --model "$KVSTRATA_MODEL" --kv-cache-mb 8192 --prompt-tokens 1024 --decode-tokens 64 \
        --batch-sizes 1,8,32 --kv-formats "${KVSTRATA_GPU_BENCH_FORMATS:-bf16,int2,codec}" --json "$work/json/bench-engine-cuda-$1-$2-$3.json" \
        2>&1 | tee -a "$out/bench_engine.log" | grep -vE '^\s*("|\{|\}|\]|\[)' || status=1
    done
    [[ ${KVSTRATA_GPU_BENCH:-1} == 1 ]] && tar cf "$out/bench-engine-json.tar" -C "$work/json" .
    [[ ${KVSTRATA_GPU_CLUSTER:-1} == 1 ]] || exit $status
    echo "== a cluster serving from the GPU"
    # Ports away from the defaults, which that machine's own services may hold.
    export KVSTRATA_CLUSTER_DIR=$work/cluster BUILD_DIR=$work/device KVSTRATA_DECODE_DEVICE=cuda \
      KVSTRATA_ROUTER_PORT=58070 KVSTRATA_ROUTER_METRICS_PORT=59470 KVSTRATA_DECODE0_PORT=58071 \
      KVSTRATA_DECODE0_METRICS_PORT=59471 KVSTRATA_DECODE1_PORT=58072 \
      KVSTRATA_DECODE1_METRICS_PORT=59472 KVSTRATA_KVSTORE_PORT=58061 \
      KVSTRATA_KVSTORE_METRICS_PORT=59461
    if ! scripts/cluster.sh up >"$out/cluster.log" 2>&1; then
      tail -8 "$out/cluster.log"
      scripts/cluster.sh down >/dev/null 2>&1
      echo "-- again with OPENBLAS_NUM_THREADS=1" | tee -a "$out/cluster.log"
      OPENBLAS_NUM_THREADS=1 scripts/cluster.sh up >>"$out/cluster.log" 2>&1 || {
        status=1
        tail -8 "$out/cluster.log"
      }
    fi
    kvstrata demo-chat --target=127.0.0.1:58070 2>&1 | tee "$out/demo_chat.log" | tail -25 ||
      status=1
    curl -s http://127.0.0.1:59471/metrics |
      grep -E "^kvstrata_decode_(requests_total|generated_tokens_total|prompt_tokens_total)" |
      tee -a "$out/demo_chat.log"
    scripts/cluster.sh down >/dev/null 2>&1
    grep -h "serving kvstrata.v1.Generation" "$work"/cluster/decode-*.log | head -2
    exit $status
    ;;
  transport)
    # The same-GPU transport: its benchmark (fetch times beside gRPC, with its own checks), then
    # a cluster whose kvstore keeps pages in an HBM pool on the GPU both workers use, decode-0
    # copying pool pages (--same_gpu_pages=copy) and decode-1 reading them in place (the
    # default). A prompt computed on one worker is answered again by the other from the store's
    # pool, by each path, with the same greedy text; then the store is killed while decode-1
    # decodes from pages in its pool, and the answer still comes, the same as computed.
    source "$work/device/env.sh"
    join_model || exit 1
    status=0
    echo "== kvstrata_bench_transport"
    kvstrata_bench_transport --json="$out/transport.json" 2>&1 | grep -v "^kvstore: evicting" |
      tee "$out/transport_bench.log" || status=1
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    echo "== a cluster with the kvstore on the GPU"
    # No local page tier: a prompt a worker has seen still comes from the kvstore's pool.
    export KVSTRATA_CLUSTER_DIR=$work/cluster-t BUILD_DIR=$work/device KVSTRATA_DECODE_DEVICE=cuda \
      KVSTRATA_KVSTORE_DEVICE=cuda KVSTRATA_ROUTER_PORT=58170 KVSTRATA_ROUTER_METRICS_PORT=59570 \
      KVSTRATA_ROUTER_HTTP_PORT=0 \
      KVSTRATA_DECODE0_ARGS="--same_gpu_pages=copy --local_cache_mb=0" \
      KVSTRATA_DECODE1_ARGS="--local_cache_mb=0" \
      KVSTRATA_DECODE0_PORT=58171 KVSTRATA_DECODE0_METRICS_PORT=59571 KVSTRATA_DECODE1_PORT=58172 \
      KVSTRATA_DECODE1_METRICS_PORT=59572 KVSTRATA_KVSTORE_PORT=58161 \
      KVSTRATA_KVSTORE_METRICS_PORT=59561
    scripts/cluster.sh up >"$out/cluster_transport.log" 2>&1 || { tail -20 "$out/cluster_transport.log"; exit 1; }
    grep -h "serving kvstrata.v1.KvStore" "$work"/cluster-t/kvstore.log | tee -a "$out/transport_e2e.log"
    log() { echo "$*" | tee -a "$out/transport_e2e.log"; }
    # ask WORKER NAME PROMPT MAX_TOKENS: the greedy answer in $out/NAME.txt, usage in NAME.usage
    # (WORKER 0 or 1, or -1 for the router).
    ask() {
      kvstrata request --target=127.0.0.1:5817$(($1 + 1)) --prompt="$3" --max_tokens="$4" \
        --temperature=0 >"$out/$2.txt" 2>"$out/$2.usage" || status=1
      tee -a "$out/transport_e2e.log" <"$out/$2.usage"
    }
    same() {  # A B WHAT
      if cmp -s "$out/$1.txt" "$out/$2.txt"; then log "same greedy text: $3"; else
        log "DIFFERENT greedy text: $3"; diff "$out/$1.txt" "$out/$2.txt" | head; status=1; fi
      grep -q "cached_kvstore=[1-9]" "$out/$2.usage" || { log "$2 took nothing from the kvstore"; status=1; }
    }
    metric() { curl -s "http://127.0.0.1:$1/metrics" | grep -E "^$2" | awk '{s += $2} END {print s + 0}'; }
    a="$(head -c 6000 README.md) Summarise the text above in one sentence."
    b="$(head -c 6000 docs/architecture.md) Summarise the text above in one sentence."
    c="$(tail -c 6000 docs/kvstore.md) Now write the numbers from 1 to 400, separated by commas: 1, 2, 3,"
    ask 0 a-computed "$a" 32; sleep 2  # decode-0 publishes its pages in the background
    ask 1 a-in-place "$a" 32
    same a-computed a-in-place "decode-1 read the prefix in place from the kvstore's pool"
    ask 1 b-computed "$b" 32; sleep 2
    ask 0 b-copied "$b" 32
    same b-computed b-copied "decode-0 copied the prefix from the kvstore's pool"
    e="$(tail -c 6000 docs/api.md) Summarise the text above in one sentence."
    ask 0 e-computed "$e" 32; sleep 2
    ask -1 e-routed "$e" 32
    same e-computed e-routed "through the router, the prefix from the kvstore's pool ($(grep -o 'worker=[a-z0-9-]*' "$out/e-routed.usage"))"
    in_place=$(metric 59572 kvstrata_decode_prefix_pages_read_in_place_total)
    copied_in_place=$(metric 59571 kvstrata_decode_prefix_pages_read_in_place_total)
    log "pages read in place: decode-1 $in_place, decode-0 (copy) $copied_in_place"
    [[ $in_place -gt 0 && $copied_in_place -eq 0 ]] || { log "in-place counts are wrong"; status=1; }
    for w in 59571 59572; do
      curl -s http://127.0.0.1:$w/metrics | grep -E "^kvstrata_decode_kvstore_(transfers|errors)_total" |
        tee -a "$out/transport_e2e.log"
    done
    curl -s http://127.0.0.1:59561/metrics |
      grep -E "^kvstrata_kvstore_(transfers_total|tier_|held_leases|pool_holders|active_leases)" |
      tee -a "$out/transport_e2e.log"
    grep -h "mapped the kvstore pool" "$work"/cluster-t/decode-*.log | tee -a "$out/transport_e2e.log"
    log "== the kvstore killed while decode-1 decodes from pages in its pool"
    ask 0 c-computed "$c" 400; sleep 2
    kvstrata request --target=127.0.0.1:58172 --prompt="$c" --max_tokens=400 --temperature=0 \
      >"$out/c-store-killed.txt" 2>"$out/c-store-killed.usage" &
    asked=$!
    sleep 0.3
    kill -9 "$(cat "$work/cluster-t/kvstore.pid")"
    log "kvstore killed; decode-1's request still running: $(kill -0 $asked 2>/dev/null && echo yes || echo no)"
    wait $asked || status=1
    tee -a "$out/transport_e2e.log" <"$out/c-store-killed.usage"
    same c-computed c-store-killed "decode-1 finished its answer from the dead store's pool"
    log "== decode-1 still answers a new prompt without the store"
    ask 1 d-no-store "$(tail -c 5000 README.md) Summarise." 16
    scripts/cluster.sh down >/dev/null 2>&1
    cp "$work"/cluster-t/*.log "$out/" 2>/dev/null
    exit $status
    ;;
  *)
    echo "gpu_session: unknown step $step" >&2
    exit 2
    ;;
esac

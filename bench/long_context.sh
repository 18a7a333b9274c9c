#!/usr/bin/env bash
# The 8B-scale study on one GPU: whole decode steps of the CUDA engine at 8K-128K contexts, INT2
# against BF16, beside the physical floor and beside torch/transformers on the same synthetic
# model (docs/benchmarks/engine-gpu.md, "Decode steps at 8B scale"). From the repository root:
#
#   here:   scripts/build.sh && bench/long_context.sh pack      # .devpack-8b/: the benchmark
#   there:  bench/long_context.sh decode    (carry .devpack-8b)  # kvstrata decode steps
#   there:  bench/long_context.sh prefill   (carry .devpack-8b)  # kvstrata prefill, TTFT
#   there:  bench/long_context.sh torch                          # transformers, the same model
#   there:  bench/long_context.sh cluster   (carry .devpack-8b)  # the GPU demo: a local cluster
#                                                                # serving the 8B model, loadtest
#
# Every step on the GPU machine first writes the synthetic Qwen3-8B-shaped model
# (bench/synthetic_model.py, 16 GB of BF16, seed 20261201) to /tmp/kvstrata-8b unless it is
# there already. Results go to ${OUT:-bench-out}/long-context-*.json and *.log.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: bench/long_context.sh pack|decode|prefill|torch|cluster}
work=/tmp/kvstrata-8b
out=${OUT:-bench-out}
mkdir -p "$out"

model() {
  if [[ ! -f $work/model/.complete ]]; then
    rm -rf "$work/model"
    python3 bench/synthetic_model.py --out "$work/model" || exit 1
    touch "$work/model/.complete"
  fi
}
unpack() {
  if [[ ! -x $work/device/bin/kvstrata_bench_long_context ]]; then
    mkdir -p "$work/device" && tar xJf .devpack-8b/bin.tar.xz -C "$work/device" || exit 1
  fi
}

case $step in
  pack)
    ../shared/tools/device-pack --out .device-8b build/bin/kvstrata_bench_long_context \
      build/bin/kvstrata-router build/bin/kvstrata-decode build/bin/kvstrata-kvstore \
      build/bin/kvstrata-loadtest build/bin/kvstrata >/dev/null
    strip -s .device-8b/bin/* 2>/dev/null
    mkdir -p .devpack-8b
    grep -qxF "/.devpack-8b/" .git/info/exclude || echo "/.devpack-8b/" >>.git/info/exclude
    tar cf - -C .device-8b . | xz -T0 -6 >.devpack-8b/bin.tar.xz
    du -sh .devpack-8b/*
    ;;
  decode)
    model
    unpack
    # shellcheck disable=SC1091
    (source "$work/device/env.sh" && kvstrata_bench_long_context --model "$work/model" \
      --prefill_contexts= --json "$out/long-context-decode.json" ${KVSTRATA_BENCH_ARGS:-}) \
      2>&1 | grep --line-buffered -vE '^\s*[]["{}]|^\s+"' | tee "$out/long-context-decode.log"
    ;;
  prefill)
    model
    unpack
    (source "$work/device/env.sh" && kvstrata_bench_long_context --model "$work/model" \
      --contexts= --budget_context=0 --prefill_contexts="${KVSTRATA_PREFILL:-8192,32768,102400}" \
      --json "$out/long-context-prefill.json" ${KVSTRATA_BENCH_ARGS:-}) \
      2>&1 | grep --line-buffered -vE '^\s*[]["{}]|^\s+"' | tee "$out/long-context-prefill.log"
    ;;
  torch)
    model
    python3 bench/torch_decode_step.py --model "$work/model" --json "$out/long-context-torch.json" \
      2>&1 | grep --line-buffered -vE '^\s*[]["{}]|^\s+"' | tee "$out/long-context-torch.log"
    ;;
  cluster)
    # The demo for a GPU machine: the local cluster (router, two decode workers on the GPU, a
    # kvstore) on the synthetic 8B model, then kvstrata-loadtest replaying the first 40
    # requests of the Mooncake trace at 1/16 of their lengths (the model's tokenizer is bytes:
    # token ids, not text), printing latencies, tokens/s and the cache hit ratio.
    model
    unpack
    export KVSTRATA_CLUSTER_DIR=$work/cluster BUILD_DIR=$work/device KVSTRATA_DECODE_DEVICE=cuda \
      KVSTRATA_MODEL=$work/model KVSTRATA_DECODE_KV_MB=${KVSTRATA_DECODE_KV_MB:-24576} \
      KVSTRATA_CLUSTER_TIMEOUT=300 KVSTRATA_ROUTER_PORT=58070 KVSTRATA_ROUTER_METRICS_PORT=59470 \
      KVSTRATA_DECODE0_PORT=58071 KVSTRATA_DECODE0_METRICS_PORT=59471 KVSTRATA_DECODE1_PORT=58072 \
      KVSTRATA_DECODE1_METRICS_PORT=59472 KVSTRATA_KVSTORE_PORT=58061 \
      KVSTRATA_KVSTORE_METRICS_PORT=59461
    # shellcheck disable=SC1091
    source "$work/device/env.sh"
    status=0
    scripts/cluster.sh up >"$out/long-context-cluster.log" 2>&1 || { status=1; tail -5 "$out/long-context-cluster.log"; }
    [[ $status == 0 ]] && kvstrata-loadtest --target=127.0.0.1:58070 --workload=trace \
      --trace=tests/loadtest/data/mooncake_conversation_head.jsonl --trace_scale=0.0625 \
      --arrivals=closed --concurrency=8 --json="$out/long-context-cluster-loadtest.json" \
      2>&1 | tee "$out/long-context-cluster-loadtest.log" || status=1
    grep -h "serving kvstrata.v1.Generation" "$work"/cluster/decode-*.log | head -2
    scripts/cluster.sh down >/dev/null 2>&1
    exit $status
    ;;
  *)
    echo "long_context: unknown step $step" >&2
    exit 2
    ;;
esac

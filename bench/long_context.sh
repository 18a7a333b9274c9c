#!/usr/bin/env bash
# The 8B-scale study on one GPU: whole decode steps of the CUDA engine at 8K-128K contexts, INT2
# against BF16, beside the physical floor and beside torch/transformers on the same synthetic
# model (docs/benchmarks.md, "Decode steps at 8B scale"). From the repository root:
#
#   here:   scripts/build.sh && bench/long_context.sh pack      # .devpack-8b/: the benchmark
#   there:  bench/long_context.sh decode    (carry .devpack-8b)  # kvstrata decode steps
#   there:  bench/long_context.sh prefill   (carry .devpack-8b)  # kvstrata prefill, TTFT
#   there:  bench/long_context.sh torch                          # transformers, the same model
#
# Every step on the GPU machine first writes the synthetic Qwen3-8B-shaped model
# (bench/synthetic_model.py, 16 GB of BF16, seed 20261201) to /tmp/kvstrata-8b unless it is
# there already. Results go to ${OUT:-bench-out}/long-context-*.json and *.log.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: bench/long_context.sh pack|decode|prefill|torch}
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
    ../shared/tools/device-pack --out .device-8b build/bin/kvstrata_bench_long_context >/dev/null
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
  *)
    echo "long_context: unknown step $step" >&2
    exit 2
    ;;
esac

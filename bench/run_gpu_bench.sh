#!/usr/bin/env bash
# Runs on a machine with a GPU, from the repository root, after
#   ../shared/tools/device-pack build/bin/kvstrata_bench_attention build/tests/kernels/*_gpu_test
# has bundled the binaries into .device/: the GPU tests, then the attention benchmark and the
# torch baseline side by side. Writes everything under ${OUT:-bench-out}/.
set -uo pipefail
out=${OUT:-bench-out}
mkdir -p "$out"
source .device/env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
status=0
for t in .device/bin/*_gpu_test; do
  echo "== $t"
  "$t" 2>&1 | tee -a "$out/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED|split decode:|append head_dim|int2 dequant:" || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done
echo "== attention benchmark"
kvstrata_bench_attention "$@" | tee "$out/kvstrata_attention.jsonl"
echo "== torch baseline"
python3 bench/torch_sdpa_bench.py | tee "$out/torch_attention.jsonl"
exit $status

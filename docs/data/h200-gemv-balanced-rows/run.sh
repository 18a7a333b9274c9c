#!/usr/bin/env bash
# call 5: the normed GEMVs' wave with the same rows for every warp: GEMV tests, 8B A/B
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
( python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete ) &
timeout 150 kernels_gemv_gpu_test > $OUT/r/gemv_test.log 2>&1
echo "gemv test rc=$?" >> $OUT/r/status
wait
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16"
for round in 1 2; do
  for bal in false true; do
    timeout 120 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --kv_formats=int2 \
      --gpu_gemv_normed_balanced_rows=$bal --json $OUT/r/e2e-int2-balanced-$bal-$round.json \
      > $OUT/r/e2e-int2-balanced-$bal-$round.log 2>&1
    echo "e2e int2 balanced=$bal round=$round rc=$?" >> $OUT/r/status
  done
done
for bal in false true; do
  timeout 120 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --kv_formats=bf16 \
    --gpu_gemv_normed_balanced_rows=$bal --json $OUT/r/e2e-bf16-balanced-$bal.json \
    > $OUT/r/e2e-bf16-balanced-$bal.log 2>&1
  echo "e2e bf16 balanced=$bal rc=$?" >> $OUT/r/status
done
tar czf $OUT/r.tgz -C $OUT r

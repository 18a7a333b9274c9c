#!/usr/bin/env bash
# call 1: INT2 staged pages: attention bench + e2e A/B
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/r/gpu.txt
( python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete ) &
kvstrata_bench_attention --formats int2 --int2_steps 10,12,13 --batches 1,2,8,32 \
  --contexts 8192,32768,102400,131072 --rounds 4 > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status
wait
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16 --kv_formats=int2"
for round in 1 2; do
  for staged in false true; do
    timeout 120 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
      --gpu_int2_pages_staged=$staged --json $OUT/r/e2e-staged-$staged-$round.json \
      > $OUT/r/e2e-staged-$staged-$round.log 2>&1
    echo "e2e staged=$staged round=$round rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r

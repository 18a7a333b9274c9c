#!/usr/bin/env bash
# call 4: the final build: kernel tests, attention steps, stall reasons, 8B end to end with the
# same-memory run
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
( python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete ) &
timeout 200 kernels_split_decode_gpu_test --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
wait
kvstrata_bench_attention --formats int2 --int2_steps 10,14 --batches 1,8 --contexts 32768,131072 \
  --rounds 4 > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status
for b in 1 32; do
  echo "== batch $b, step 13 (default)" >> $OUT/r/ncu_stalls.txt
  timeout 100 ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum \
    kvstrata_bench_attention --formats int2 --shapes qwen3-8b --batches $b --contexts 131072 \
    --iters 2 --rounds 1 --int2_steps 13 >> $OUT/r/ncu_stalls.txt 2>&1
  echo "ncu b$b rc=$?" >> $OUT/r/status
done
tar czf $OUT/r.tgz -C $OUT r
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=102400 --profile_steps=0 --graph_history_buckets=16"
timeout 290 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
  --json $OUT/r/e2e.json > $OUT/r/e2e.log 2>&1
echo "e2e rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

#!/usr/bin/env bash
# call 3: page slots read one request ahead: attention steps, e2e A/B, kernel tests
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
( python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete ) &
kvstrata_bench_attention --formats int2 --int2_steps 10,14,15,16 --batches 1,2,8,32 \
  --contexts 8192,32768,102400,131072 --rounds 4 > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status
wait
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16 --kv_formats=int2"
for round in 1 2; do
  for ahead in false true; do
    timeout 120 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
      --gpu_int2_slots_ahead=$ahead --json $OUT/r/e2e-ahead-$ahead-$round.json \
      > $OUT/r/e2e-ahead-$ahead-$round.log 2>&1
    echo "e2e ahead=$ahead round=$round rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r
timeout 170 kernels_split_decode_gpu_test --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodeGpu.LongPage*:SplitDecodeGpu.WindowCtas*' > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

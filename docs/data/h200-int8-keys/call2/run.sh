#!/usr/bin/env bash
# call 2 (the machine of call 1, still warm): the 8B step end to end, INT2 with fp16 pairs and
# with the keys on integer tensor cores alternated twice (the second time with the same-memory
# run: as many 100K sequences as 100 GB of pages hold), then BF16 once, in one call.
set -u
W=/tmp/kvstrata-8b
source $W/device/env.sh
mkdir -p $OUT/r
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for keys in fp16 int8; do
    flag=false; [ $keys = int8 ] && flag=true
    budget=0; [ $rep = 2 ] && budget=102400
    timeout 110 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --kv_formats=int2 \
      --budget_context=$budget \
      --gpu_int2_int8_keys=$flag --json $OUT/r/e2e-int2-$keys-$rep.json > $OUT/r/e2e-int2-$keys-$rep.log 2>&1
    echo "e2e $keys $rep rc=$?" >> $OUT/r/status
  done
done
timeout 100 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --kv_formats=bf16 \
  --budget_context=0 \
  --json $OUT/r/e2e-bf16.json > $OUT/r/e2e-bf16.log 2>&1
echo "e2e bf16 rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

#!/usr/bin/env bash
# The build: main at 10957af with tried/merge-in-last-cta.diff applied (not merged), packed as
# .devpack-8b (kvstrata_bench_long_context, kvstrata_bench_attention, kernels_split_decode_gpu_test).
# call 2 (the machine of call 1, still warm): the attention steps side by side (the merge as a
# launch of its own: INT2 steps 13-14, BF16 5-6; in the last CTA: INT2 15-16, BF16 8-9; each
# not launched early, then early), then the 8B step end to end with the merge in the last CTA
# (default) and as a launch of its own, alternated, INT2.
set -u
W=/tmp/kvstrata-8b
source $W/device/env.sh
mkdir -p $OUT/r
P="--formats int2,bf16 --int2_steps 13,14,15,16 --bf16_steps 5,6,8,9 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 4"
timeout 200 kvstrata_bench_attention $P > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for merge in kernel cta; do
    flag=true; [ $merge = kernel ] && flag=false
    timeout 80 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --kv_formats=int2 \
      --gpu_merge_in_last_cta=$flag --json $OUT/r/e2e-int2-$merge-$rep.json > $OUT/r/e2e-int2-$merge-$rep.log 2>&1
    echo "e2e $merge $rep rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r

#!/usr/bin/env bash
# call 3 (the machine of call 2, still warm): the same-memory run of both formats in one run, INT2
# with the keys on integer tensor cores (the build of calls 1-2).
set -u
W=/tmp/kvstrata-8b
source $W/device/env.sh
mkdir -p $OUT/r
timeout 150 kvstrata_bench_long_context --model $W/model --prefill_contexts= --contexts=102400 \
  --batch_sizes=1 --profile_steps=0 --graph_history_buckets=16 --kv_formats=bf16,int2 \
  --gpu_int2_int8_keys=true --budget_context=102400 --json $OUT/r/e2e-budget.json \
  > $OUT/r/e2e-budget.log 2>&1

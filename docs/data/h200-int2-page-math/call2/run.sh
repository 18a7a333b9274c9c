#!/usr/bin/env bash
# call 2 (the machine of call 1, still warm): both formats and the same-memory run on the new
# build (kvstrata_bench_long_context of .devpack-8b, unpacked by call 1).
set -u
W=/tmp/kvstrata-8b
source $W/device/env.sh
mkdir -p $OUT/f
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=102400 --profile_steps=0 --graph_history_buckets=16"
timeout 250 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A --json $OUT/f/e2e.json > $OUT/f/e2e.log 2>&1

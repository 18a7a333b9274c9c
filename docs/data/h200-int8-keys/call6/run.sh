#!/usr/bin/env bash
# call 6 (the machine of call 5, still warm; call 5's build): batch 1, launched early and not,
# twice; then torch's cuDNN and flash beside the default launched early, at 32K and 128K.
set -u
W=/tmp/kvstrata-8b
source $W/device/env.sh
mkdir -p $OUT/r
for rep in 1 2; do
  timeout 30 kvstrata_bench_attention --formats int2 --shapes qwen3-8b --int2_steps 13,14,17,18 \
    --batches 1 --contexts 8192,32768,131072 --rounds 4 >> $OUT/r/attention-b1-early.jsonl
done
timeout 80 python3 bench/torch_sdpa_bench.py --contexts 32768,131072 --batches 1 --shapes qwen3-8b \
  > $OUT/r/torch_b1.jsonl
timeout 20 kvstrata_bench_attention --formats int2 --shapes qwen3-8b --int2_steps 18 --batches 1 \
  --contexts 32768,131072 --rounds 4 > $OUT/r/int2_b1.jsonl

#!/usr/bin/env bash
# The build: main at 10957af with tried/merge-in-last-cta.diff applied (not merged), packed as
# .devpack-8b (kvstrata_bench_long_context, kvstrata_bench_attention, kernels_split_decode_gpu_test).
# call 1: the split decode kernel tests on the build with the merge in the last CTA of each
# (sequence, KV head); the 8B synthetic model written meanwhile for the calls after.
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/r/gpu.txt
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
timeout 450 kernels_split_decode_gpu_test > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
wait
ls $W/model >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

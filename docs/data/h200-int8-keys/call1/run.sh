#!/usr/bin/env bash
# call 1: the split decode kernel tests with the INT2 keys on integer tensor cores among the
# variants, then the INT2 steps side by side (13-14: fp16 pairs, the default; 15-16: keys on
# integer tensor cores; each not launched early, then early); the 8B synthetic model written
# meanwhile for call 2. The build: .devpack-8b (kvstrata_bench_long_context,
# kvstrata_bench_attention, kernels_split_decode_gpu_test).
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/r/gpu.txt
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
timeout 330 kernels_split_decode_gpu_test \
  --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodeGpu.LongPageRangesKeepTheirPrecision:SplitDecodeGpu.WritesOutputRowsInSixteenBitFloats:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r
P="--formats int2 --int2_steps 13,14,15,16 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 4"
timeout 150 kvstrata_bench_attention $P > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status
wait
ls $W/model >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

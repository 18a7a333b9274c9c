#!/usr/bin/env bash
# call 4 (a fresh machine): the build with the keys on integer tensor cores in ranges of 32 pages
# or more (the default since): the split decode kernel tests, then the INT2 steps side by side
# (13-14: fp16 pairs everywhere; 17-18: the default; each not launched early, then early).
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
timeout 330 kernels_split_decode_gpu_test \
  --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodeGpu.LongPageRangesKeepTheirPrecision:SplitDecodeGpu.WritesOutputRowsInSixteenBitFloats:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
P="--formats int2 --int2_steps 13,14,17,18 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 4"
timeout 150 kvstrata_bench_attention $P > $OUT/r/attention.jsonl 2> $OUT/r/attention.err
echo "attention rc=$?" >> $OUT/r/status

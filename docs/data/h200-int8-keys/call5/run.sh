#!/usr/bin/env bash
# call 5 (a fresh machine): the queries' rows padded in shared memory and the integer keys' scale
# taken as the queries come in (the range start); the build before it (call 4's) as
# kvstrata_bench_attention_before. The split decode kernel test, then INT2 steps 13 (fp16 pairs
# everywhere) and 15 (integer keys in every range) of both builds, alternated, 8B shape.
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
timeout 200 kernels_split_decode_gpu_test \
  --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodeGpu.WritesOutputRowsInSixteenBitFloats' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
P="--formats int2 --shapes qwen3-8b --int2_steps 13,15 --batches 1,8 --contexts 8192,32768,131072 --rounds 4"
for build in before after before after; do
  bin=kvstrata_bench_attention; [ $build = before ] && bin=kvstrata_bench_attention_before
  timeout 40 $bin $P >> $OUT/r/attention-$build.jsonl 2>> $OUT/r/attention.err
  echo "attention $build rc=$?" >> $OUT/r/status
done

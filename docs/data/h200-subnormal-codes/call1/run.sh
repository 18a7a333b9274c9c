#!/usr/bin/env bash
# call 1: the INT2 kernel with subnormal code operands and scores taken off the running maximum
# (build "after") beside main before it (build "before", *_before): kernel tests, the attention
# steps alternated between the two builds, instruction counts, and the 8B step end to end.
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
timeout 200 kernels_split_decode_gpu_test --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
wait
P="--formats int2 --int2_steps 13 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 2"
for rep in 1 2; do
  for build in before after; do
    bin=kvstrata_bench_attention; [ $build = before ] && bin=kvstrata_bench_attention_before
    timeout 120 $bin $P > $OUT/r/attention-$build-$rep.jsonl 2> $OUT/r/attention-$build-$rep.err
    echo "attention $build $rep rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r
for build in before after; do
  bin=kvstrata_bench_attention; [ $build = before ] && bin=kvstrata_bench_attention_before
  for b in 1 32; do
    echo "== $build batch $b" >> $OUT/r/ncu.txt
    timeout 60 ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
      --metrics smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $bin --formats int2 --shapes qwen3-8b --batches $b --contexts 131072 \
      --iters 2 --rounds 1 --int2_steps 13 >> $OUT/r/ncu.txt 2>&1
    echo "ncu $build b$b rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r

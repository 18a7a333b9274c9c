#!/usr/bin/env bash
# One call: the INT2 kernel with pairs 5-7's shift as an integer multiply-high ("after"), beside
# main at e0521c8 ("before") and the same kernel split into prologue / page loop / epilogue
# functions without that change ("split"): attention steps alternated, pipe use from ncu, and the
# reference test on "after".
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
P="--formats int2 --int2_steps 13 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 2"
for rep in 1 2; do
  for build in before split after; do
    bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
    timeout 120 $bin $P > $OUT/r/attention-$build-$rep.jsonl 2> $OUT/r/attention-$build-$rep.err
    echo "attention $build $rep rc=$?" >> $OUT/r/status
  done
done
for build in before after; do
  bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
  echo "== $build batch 32" >> $OUT/r/ncu.txt
  timeout 60 ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
    $bin --formats int2 --shapes qwen3-8b --batches 32 --contexts 131072 \
    --iters 2 --rounds 1 --int2_steps 13 >> $OUT/r/ncu.txt 2>&1
  echo "ncu $build rc=$?" >> $OUT/r/status
done
tar czf $OUT/r.tgz -C $OUT r
timeout 200 kernels_split_decode_gpu_test --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

#!/usr/bin/env bash
# call 1: three builds of the INT2 kernel side by side: "before" (main at 1ffa862: codes as
# subnormals), "vote" (bd3f5f1: page maxima reduced only when a score is above the running one)
# and "after" (+ P' from one fp16x2 multiply a token): kernel tests, the attention steps
# alternated, instruction counts, and the 8B step end to end (before / after).
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
  for build in before vote after; do
    bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
    timeout 120 $bin $P > $OUT/r/attention-$build-$rep.jsonl 2> $OUT/r/attention-$build-$rep.err
    echo "attention $build $rep rc=$?" >> $OUT/r/status
  done
done
for build in before after; do
  bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
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
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for build in before after; do
    bin=kvstrata_bench_long_context; [ $build = before ] && bin=kvstrata_bench_long_context_before
    timeout 80 $bin --model $W/model --prefill_contexts= $A --kv_formats=int2 \
      --json $OUT/r/e2e-int2-$build-$rep.json > $OUT/r/e2e-int2-$build-$rep.log 2>&1
    echo "e2e $build $rep rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r

#!/usr/bin/env bash
# One call: the INT2 kernel with each head in two mma columns and each lane's softmax over half a
# tile's rows for groups of <= 4 heads ("after"), beside main at c6b4a2a ("before"): the
# attention steps alternated, instruction counts, the kernel tests, and the 8B step end to end.
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
P="--formats int2 --int2_steps 13 --batches 1,8,32 --contexts 8192,32768,131072 --rounds 2"
for rep in 1 2; do
  for build in before after; do
    bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
    timeout 120 $bin $P > $OUT/r/attention-$build-$rep.jsonl 2> $OUT/r/attention-$build-$rep.err
    echo "attention $build $rep rc=$?" >> $OUT/r/status
  done
done
for build in before after; do
  bin=kvstrata_bench_attention; [ $build != after ] && bin=kvstrata_bench_attention_$build
  echo "== $build batch 32" >> $OUT/r/ncu.txt
  timeout 60 ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active \
    $bin --formats int2 --shapes qwen3-8b --batches 32 --contexts 131072 \
    --iters 2 --rounds 1 --int2_steps 13 >> $OUT/r/ncu.txt 2>&1
  echo "ncu $build rc=$?" >> $OUT/r/status
done
tar czf $OUT/r.tgz -C $OUT r
timeout 280 kernels_split_decode_gpu_test \
  --gtest_filter='SplitDecodeGpu.MatchesCpuReference:SplitDecodeGpu.LongPageRangesKeepTheirPrecision:SplitDecodePlan.*' \
  > $OUT/r/split_decode_test.log 2>&1
echo "test rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r
wait
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=0 --profile_steps=0 --graph_history_buckets=16"
timeout 60 kvstrata_bench_long_context_before --model $W/model --prefill_contexts= $A --kv_formats=int2 \
  --json $OUT/r/e2e-int2-before.json > $OUT/r/e2e-int2-before.log 2>&1
echo "e2e before rc=$?" >> $OUT/r/status
timeout 100 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
  --json $OUT/r/e2e.json > $OUT/r/e2e.log 2>&1
echo "e2e after rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

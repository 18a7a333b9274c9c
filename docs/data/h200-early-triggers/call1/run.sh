#!/usr/bin/env bash
# call 1 (a fresh machine): launches that let the kernel after them begin at once, measured end
# to end. Builds (.devpack-8b): before = main at 9a8799a; gemv = ae357e1 (the normed GEMVs'
# loads at once; the paired kernel at 2 tokens holding one float4 a row); a = gemv + the
# per-head launch letting attention begin before it waits; abc = a + the INT2 history kernel
# and the merge letting the launch after them begin at their start. While the 8B model is
# written: abc's kernel tests (GEMV, model ops, split decode less its reference tests).
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/r/gpu.txt
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
for t in kernels_gemv_gpu_test kernels_model_ops_gpu_test kernels_split_decode_gpu_test; do
  f='*'; [[ $t == *split_decode* ]] && f='-SplitDecodeGpu.MatchesCpuReference*'
  timeout 150 $t --gtest_filter="$f" > $OUT/r/$t.log 2>&1
  echo "$t rc=$?" >> $OUT/r/status
done
tar czf $OUT/r.tgz -C $OUT r
wait
A="--contexts=8192,102400 --batch_sizes=1,2 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for build in gemv a abc before; do
    [ $build = before ] && [ $rep = 2 ] && continue
    timeout 100 kvstrata_bench_long_context_$build --model $W/model --prefill_contexts= $A \
      --kv_formats=int2 --budget_context=0 --json $OUT/r/e2e-$build-$rep.json > $OUT/r/e2e-$build-$rep.log 2>&1
    echo "e2e $build $rep rc=$?" >> $OUT/r/status
    tar czf $OUT/r.tgz -C $OUT r
  done
done

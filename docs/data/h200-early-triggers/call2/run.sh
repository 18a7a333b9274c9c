#!/usr/bin/env bash
# call 2 (a fresh machine): the build with the launches ahead as an engine option
# (gpu_launch_ahead_at_batch_1, default on): the kernel tests it touches, then the 8B step at
# batch 1 with the option off and on, alternated twice (INT2 and BF16 the first time, INT2 the
# second). Then `bench/gpu_session.sh stage 0`, `stage 1` and `engine` (KVSTRATA_GPU_BENCH=0,
# KVSTRATA_GPU_TEST_FILTER='-*NextTokenDistributions*') on the same machine.
set -u
work=/tmp/kvstrata-gpu W=/tmp/kvstrata-8b
rm -rf $work && mkdir -p $work/device $W/device $OUT/r
tar xJf .devpack/bin.tar.xz -C $work/device
tar xJf .devpack-8b/bin.tar.xz -C $W/device
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
(
  source $work/device/env.sh
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/r/gpu.txt
  for t in kernels_model_ops_gpu_test kernels_split_decode_gpu_test kernels_gemv_gpu_test; do
    f='*'; [[ $t == *split_decode* ]] && f='-SplitDecodeGpu.MatchesCpuReference*:*Codec*'
    timeout 150 $work/device/bin/$t --gtest_filter="$f" > $OUT/r/$t.log 2>&1
    echo "$t rc=$?" >> $OUT/r/status
  done
)
tar czf $OUT/r.tgz -C $OUT r
wait
source $W/device/env.sh
A="--contexts=8192,32768,102400 --batch_sizes=1 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for ahead in false true; do
    formats=int2; [ $rep = 1 ] && formats=int2,bf16
    timeout 120 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
      --kv_formats=$formats --budget_context=0 --gpu_launch_ahead_at_batch_1=$ahead \
      --json $OUT/r/e2e-ahead-$ahead-$rep.json > $OUT/r/e2e-ahead-$ahead-$rep.log 2>&1
    echo "e2e ahead=$ahead $rep rc=$?" >> $OUT/r/status
    tar czf $OUT/r.tgz -C $OUT r
  done
done

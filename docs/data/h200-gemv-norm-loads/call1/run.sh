#!/usr/bin/env bash
# call 1: the GEMVs that normalise their input, with each thread's loads of x (and, at one row,
# the norm weights) asked for at once: kernels_gemv_gpu_test (the same bits as RmsNormTo + Gemv),
# then the 8B step (synthetic weights) of the build before (main at 9a8799a, as
# kvstrata_bench_long_context_before) and after, alternated twice, INT2 and BF16, in one call.
# The build: .devpack-8b (kvstrata_bench_long_context, _before, kernels_gemv_gpu_test); its
# paired kernel at 2 tokens held two float4s a row (ae357e1 holds one: docs/data/
# h200-early-triggers/call1 times that build).
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/r/gpu.txt
( [ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; } ) &
timeout 120 kernels_gemv_gpu_test > $OUT/r/gemv_test.log 2>&1
echo "gemv test rc=$?" >> $OUT/r/status
wait
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --profile_steps=0 --graph_history_buckets=16"
for rep in 1 2; do
  for build in before after; do
    bin=kvstrata_bench_long_context; [ $build = before ] && bin=kvstrata_bench_long_context_before
    formats=int2; [ $rep = 2 ] && formats=int2,bf16
    timeout 150 $bin --model $W/model --prefill_contexts= $A --kv_formats=$formats \
      --budget_context=0 --json $OUT/r/e2e-$build-$rep.json > $OUT/r/e2e-$build-$rep.log 2>&1
    echo "e2e $build $rep rc=$?" >> $OUT/r/status
    tar czf $OUT/r.tgz -C $OUT r
  done
done

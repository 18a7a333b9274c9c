#!/usr/bin/env bash
# call 2 (the machine of call 1, still warm): the 8B step end to end, INT2 before and after
# alternated, then both formats and the same-memory run on the new build.
set -u
W=/tmp/kvstrata-8b
mkdir -p $OUT/r
source $W/device/env.sh
[ -f $W/model/.complete ] || { python3 bench/synthetic_model.py --out $W/model > $OUT/r/model.log 2>&1 && touch $W/model/.complete; }
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
A="--contexts=8192,32768,102400 --batch_sizes=1,2 --budget_context=102400 --profile_steps=0 --graph_history_buckets=16"
timeout 250 kvstrata_bench_long_context --model $W/model --prefill_contexts= $A \
  --json $OUT/r/e2e.json > $OUT/r/e2e.log 2>&1
echo "e2e final rc=$?" >> $OUT/r/status
tar czf $OUT/r.tgz -C $OUT r

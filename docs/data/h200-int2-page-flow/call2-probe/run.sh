#!/usr/bin/env bash
# call 2: bandwidth probe of the INT2 history's page reads + Nsight Compute on the default
set -u
W=/tmp/kvstrata-8b
mkdir -p $W/device $OUT/r
tar xJf .devpack-8b/bin.tar.xz -C $W/device
source $W/device/env.sh
kvstrata_bench_attention --formats int2 --int2_steps 10,14 --batches 1,8,32 \
  --contexts 32768,131072 --rounds 4 > $OUT/r/probe.jsonl 2> $OUT/r/probe.err
echo "probe rc=$?" >> $OUT/r/status
for b in 1 32; do
  for s in 10 14; do
    echo "== batch $b, step $s" >> $OUT/r/ncu.txt
    timeout 150 ncu --clock-control none --kernel-name regex:Int2HistoryKernel --launch-count 1 \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section SpeedOfLight --section InstructionStats --section Occupancy \
      --metrics smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_tensor.sum,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
      kvstrata_bench_attention --formats int2 --shapes qwen3-8b \
      --batches $b --contexts 131072 --iters 2 --rounds 1 --int2_steps $s >> $OUT/r/ncu.txt 2>&1
    echo "ncu b$b s$s rc=$?" >> $OUT/r/status
  done
done
tar czf $OUT/r.tgz -C $OUT r

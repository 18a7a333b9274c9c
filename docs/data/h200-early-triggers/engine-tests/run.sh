#!/usr/bin/env bash
# After call 2, on the same machine: `bench/gpu_session.sh stage 0` (carry .devpack/model.0),
# `stage 1` (carry .devpack/model.1), then this (carry .devpack/model.2 .devpack/model.sha256):
# the CUDA engine's tests against the CPU engine (the distribution tests left out) and the GPU
# cluster demo, on the build of call 2.
mkdir -p $OUT/eng
KVSTRATA_GPU_BENCH=0 KVSTRATA_GPU_TEST_FILTER='-*NextTokenDistributions*' OUT=$OUT/eng \
  timeout 310 bash bench/gpu_session.sh engine > $OUT/eng/session.log 2>&1
echo rc=$? >> $OUT/eng/session.log

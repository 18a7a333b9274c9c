#!/usr/bin/env bash
# Configures and builds kvstrata into ${BUILD_DIR:-build} (CMake + Ninja, ccache when present).
# CUDA sources compile for sm_90a when nvcc is found; KVSTRATA_CUDA=OFF turns them off.
# Extra arguments are build targets (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
# ccache keys on paths relative to the checkout, and not on the working directory (which
# RelWithDebInfo's -g would otherwise add), so a fresh clone elsewhere (CI) hits the cache
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cuda_flag=()
[[ -n ${KVSTRATA_CUDA:-} ]] && cuda_flag=(-DKVSTRATA_CUDA="$KVSTRATA_CUDA")
# nvcc lives outside PATH on a fresh machine
[[ -x /usr/local/cuda/bin/nvcc && -z ${CUDACXX:-} ]] && export CUDACXX=/usr/local/cuda/bin/nvcc
if [[ ! -f $build_dir/build.ninja ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda_flag[@]}"
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"

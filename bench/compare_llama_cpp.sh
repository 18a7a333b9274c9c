#!/usr/bin/env bash
# kvstrata's CPU engine side by side with llama.cpp on the same GGUF file, prompt tokens and
# thread count (docs/benchmarks/cpu.md, "CPU engine": "Against llama.cpp").
#
#   bench/compare_llama_cpp.sh [--rounds N] [--out FILE] [compare_llama_cpp.py flags...]
#
# Creates once ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/venv-llama-cpp with the pinned
# llama-cpp-python of bench/llama-cpp-requirements.txt (it compiles llama.cpp: several minutes
# on 2 cores), builds kvstrata if needed, then runs bench/compare_llama_cpp.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
venv=$cache/venv-llama-cpp
requirements=$here/llama-cpp-requirements.txt
stamp=$venv/.requirements
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$requirements" "$stamp"; then
  echo "compare_llama_cpp: creating $venv (builds llama.cpp from source)" >&2
  python3 -m venv "$venv" >&2
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python -r "$requirements" >&2
  cp "$requirements" "$stamp"
fi
build_dir=${BUILD_DIR:-build}
[[ -x $root/$build_dir/bin/kvstrata ]] || (cd "$root" && scripts/build.sh kvstrata >&2)
model=${KVSTRATA_MODEL:-$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ -f $model ]] || "$root/scripts/fetch-model.sh" >&2
exec "$venv/bin/python" "$here/compare_llama_cpp.py" --kvstrata "$root/$build_dir/bin/kvstrata" \
  --model "$model" "$@"

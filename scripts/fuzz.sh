#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, in ${FUZZ_BUILD_DIR:-build-asan}), writes
# their seed corpora, replays the committed regression inputs, then fuzzes each target for
# SECONDS (default 30) and prints executions and coverage per target. Exit status 1 if any
# target crashed; the crashing input is kept under $work/crashes (printed).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      # CI runs: scripts/fuzz.sh 30
#
# A crash found here is fixed, and its input committed under tests/fuzz/regressions/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build_dir=${FUZZ_BUILD_DIR:-build-asan}
work=${FUZZ_WORK_DIR:-${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/fuzz}
targets=("$@")
((${#targets[@]})) || targets=(page generate_request gguf safetensors hf_config rotation_file
                              chat_template tokenizer openai_request pool_hello api_keys_file
                              page_mac_key_file page_mac put_header)
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
if [[ ! -f $build_dir/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVSTRATA_CUDA=OFF -DKVSTRATA_SANITIZE=address,undefined -DKVSTRATA_FUZZ=ON >/dev/null
fi
build_targets=(--target fuzz_seeds)
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${build_targets[@]}"

export KVSTRATA_MODEL=${KVSTRATA_MODEL:-${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
rm -rf "$work/seeds"
mkdir -p "$work/corpus" "$work/crashes"
"$build_dir/fuzz/fuzz_seeds" "$work/seeds"

failed=0
printf '%-18s %10s %8s %8s %8s  %s\n' target runs exec/s cov ft result >"$work/summary.txt"
for t in "${targets[@]}"; do
  bin=$build_dir/fuzz/fuzz_$t
  corpus=$work/corpus/$t
  mkdir -p "$corpus"
  regressions=tests/fuzz/regressions/$t
  if compgen -G "$regressions/*" >/dev/null; then
    if ! "$bin" -runs=0 "$regressions" >"$work/$t.regressions.log" 2>&1; then
      echo "fuzz: $t: a committed regression input fails again ($work/$t.regressions.log)" >&2
      tail -30 "$work/$t.regressions.log" >&2
      failed=1
      continue
    fi
  fi
  # The corpus persists between runs on this machine; the seeds are merged in each time.
  result=ok
  if ! "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -max_len=262144 \
      -print_final_stats=1 -artifact_prefix="$work/crashes/$t-" "$corpus" "$work/seeds/$t" \
      >"$work/$t.log" 2>&1; then
    result="CRASH (see $work/$t.log, input under $work/crashes)"
    failed=1
    tail -40 "$work/$t.log" >&2
  fi
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$work/$t.log" | grep -oE '[0-9]+$' || echo 0)
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$work/$t.log" | grep -oE '[0-9]+$' || echo 0)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$work/$t.log" | tail -1 || true)
  printf '%-18s %10s %8s %8s %8s  %s\n' "$t" "$runs" "$rate" "$(echo "$cov" | awk '{print $2}')" \
    "$(echo "$cov" | awk '{print $4}')" "$result" >>"$work/summary.txt"
done
cat "$work/summary.txt"
exit $failed

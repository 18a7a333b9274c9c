#!/usr/bin/env bash
# Builds kvstrata with clang under sanitizers (CPU only) and runs the tests that find bugs there;
# scripts/test.sh runs it after the regular tests, so it is part of CI.
#
#   scripts/sanitize.sh asan   # ASan + UBSan (build-asan): unit and service tests, the model
#                              # tests of the services and the cluster (their binaries are built
#                              # the same way), and the stress suite
#   scripts/sanitize.sh tsan   # TSan (build-tsan): the router, decode, kvstore and OpenAI front
#                              # tests, the load generator's client, and the cluster end to end,
#                              # the services themselves built with TSan
#   scripts/sanitize.sh        # both
#
# Any sanitizer report fails the test that caused it (errors are fatal; TSan halts the process).
# Debian's gRPC, Protobuf and Abseil are not instrumented: tests/sanitizers/tsan.supp says what
# that means for TSan and what is suppressed.
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=("$@")
((${#kinds[@]})) || kinds=(asan tsan)
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
export KVSTRATA_MODEL=${KVSTRATA_MODEL:-${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
jobs=$(nproc)

configure() {  # build dir, sanitizers, extra cmake args...
  local dir=$1 sanitize=$2
  shift 2
  if [[ ! -f $dir/build.ninja ]]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKVSTRATA_CUDA=OFF -DKVSTRATA_SANITIZE="$sanitize" "$@" >/dev/null
  fi
}

for kind in "${kinds[@]}"; do
  case $kind in
    asan)
      # The fuzz targets share this build (scripts/fuzz.sh).
      configure build-asan address,undefined -DKVSTRATA_FUZZ=ON
      echo "sanitize: building with ASan + UBSan (build-asan)"
      cmake --build build-asan -j"$jobs"
      export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      # Smaller waves than the regular run: every process is several times slower here.
      export KVSTRATA_STRESS_STREAMS=${KVSTRATA_STRESS_STREAMS:-400}
      export KVSTRATA_OPENAI_STREAMS=${KVSTRATA_OPENAI_STREAMS:-96}
      ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "unit|model|stress" \
        -E "prometheus_e2e|container_image|k8s_manifests|monitoring_"
      ;;
    tsan)
      configure build-tsan thread
      tests=(router_service_test router_contract_test router_policy_test kvstore_service_test
             kvstore_client_test kvstore_page_store_test decode_service_test
             decode_registration_test decode_local_pages_test cluster_e2e_test openai_front_test
             security_test loadtest_client_test kvstore_nccl_transfer_test decode_nccl_test
             transport_pool_socket_test)
      echo "sanitize: building with TSan (build-tsan): ${tests[*]}"
      targets=()
      for t in "${tests[@]}" kvstrata-router kvstrata-decode kvstrata-kvstore; do
        targets+=(--target "$t")
      done
      cmake --build build-tsan -j"$jobs" "${targets[@]}"
      export TSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/tsan.supp ignore_noninstrumented_modules=1 halt_on_error=1 second_deadlock_stack=1"
      regex=$(IFS='|'; echo "^(${tests[*]})\$")
      ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "$regex"
      ;;
    *)
      echo "sanitize: unknown kind '$kind' (asan or tsan)" >&2
      exit 2
      ;;
  esac
done

#!/usr/bin/env bash
# Gathers test binaries, and the shared libraries they need beyond the C and C++ runtimes and
# the GPU driver (Debian's Abseil, xxHash, OpenSSL ...), into one folder for a GPU machine
# whose image lacks them. Usage: scripts/bundle-gpu-tests.sh TEST_NAME... (default: the NCCL
# GPU tests). The folder ($OUT_DIR, default build-gpu-tests/, ignored by git) holds bin/, lib/
# and run.sh, which runs every test in bin/ with lib/ and NCCL (Python's nvidia-nccl-cu13
# wheel, or $KVSTRATA_NCCL_LIBRARY) on the loader's path.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
out=${OUT_DIR:-build-gpu-tests}
tests=("$@")
[[ ${#tests[@]} -gt 0 ]] || tests=(transport_nccl_gpu_test kvstore_nccl_gpu_test)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for t in "${tests[@]}"; do
  f=$(find "$build_dir/tests" -type f -name "$t" -perm -u+x | head -1)
  if [[ -z $f ]]; then
    echo "bundle-gpu-tests: no test binary $t under $build_dir/tests (build it first)" >&2
    exit 1
  fi
  cp "$f" "$out/bin/"
  ldd "$f" | awk '/=> \//{print $3}' |
    grep -v -E '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|libcuda|libnvidia[^/]*)\.so' |
    while read -r lib; do cp -nL "$lib" "$out/lib/"; done
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every test in bin/; arguments go to each (e.g. --gtest_repeat=3). Exit 1 if any failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' \
  2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "NCCL from: ${KVSTRATA_NCCL_LIBRARY:-${nccl:-the loader path}}"
status=0
for t in "$here"/bin/*; do
  echo "== $(basename "$t")"
  "$t" "$@" || status=1
done
exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out"

#!/usr/bin/env bash
# Installs everything kvstrata needs to build and test on a fresh Debian bookworm machine.
# Idempotent: packages already present are skipped by apt, so a second run is quick.
# CUDA 13 (nvcc, cuBLAS, NCCL) is expected under /usr/local/cuda where the machine has it;
# without it the build is CPU-only.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libeigen3-dev libopenblas-dev libssl-dev libxxhash-dev
  libmicrohttpd-dev nlohmann-json3-dev libre2-dev
  openssl  # the security tests make their CA and certificates with the openssl CLI
  prometheus-cpp-dev  # metrics: its core library (its CMake config also wants civetweb, curl, zlib)
  prometheus
  buildah debootstrap  # the CPU container image: scripts/build-image.sh
  clang libclang-rt-14-dev  # sanitizer builds and libFuzzer: scripts/sanitize.sh, scripts/fuzz.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all packages present"
fi

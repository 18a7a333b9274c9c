#!/usr/bin/env bash
# Installs the dependencies, builds everything and runs the tests (GPU tests skip themselves
# without a GPU). This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-model.sh >/dev/null
scripts/python-env.sh >/dev/null
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"

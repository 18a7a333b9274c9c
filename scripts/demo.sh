#!/usr/bin/env bash
# Installs the dependencies, builds the kvstrata tool and runs the main job. Today that is the
# KV format demo: every format side by side on long synthetic K/V with outlier channels, with
# exact bits per element and attention errors. Arguments are passed to `kvstrata format-demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-model.sh >/dev/null
scripts/build.sh kvstrata
exec "${BUILD_DIR:-build}"/bin/kvstrata format-demo "$@"

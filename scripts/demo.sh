#!/usr/bin/env bash
# The main job: installs the dependencies, fetches the model, builds the services, starts a local
# cluster on the CPU (a kvstore, a router with prefix-affinity routing and two decode workers;
# scripts/cluster.sh) and sends it chat requests that share one long system prompt
# (`kvstrata demo-chat`): each answer, the worker that served it, the prompt tokens found cached
# on that worker or in the kvstore, the cache hit ratio, the time to first token and the decode
# speed. Then it shows a few kvstrata_* lines from each /metrics endpoint and stops the cluster.
#
#   scripts/demo.sh [--keep-running] [demo-chat flags, e.g. --requests=6 --max-tokens=64]
#
# --keep-running leaves the cluster up afterwards (stop it with scripts/cluster.sh down).
# A failure, or Ctrl-C, stops the cluster too.
set -euo pipefail
cd "$(dirname "$0")/.."

keep_running=0
chat_args=()
for arg in "$@"; do
  case $arg in
    --keep-running | --keep_running) keep_running=1 ;;
    *) chat_args+=("$arg") ;;
  esac
done

scripts/install-deps.sh
scripts/fetch-model.sh >/dev/null
scripts/build.sh kvstrata kvstrata-router kvstrata-decode kvstrata-kvstore

bin=${BUILD_DIR:-build}/bin
cleanup() {
  local rc=$?
  if ((rc != 0 || !keep_running)); then
    ((rc != 0)) && echo "demo: failed (exit $rc); stopping the cluster" >&2
    scripts/cluster.sh down || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/cluster.sh up
echo
# Through the router; with KVSTRATA_CLUSTER_ROUTER=0 (no router) straight to decode-0.
target=127.0.0.1:${KVSTRATA_ROUTER_PORT:-50070}
[[ ${KVSTRATA_CLUSTER_ROUTER:-1} == 0 ]] && target=127.0.0.1:${KVSTRATA_DECODE0_PORT:-50071}
"$bin"/kvstrata demo-chat --target="$target" "${chat_args[@]}"

echo
echo "Metrics (Prometheus text format), a few lines from each endpoint:"
for endpoint in \
  "router ${KVSTRATA_ROUTER_METRICS_PORT:-9470}" \
  "decode-0 ${KVSTRATA_DECODE0_METRICS_PORT:-9471}" \
  "decode-1 ${KVSTRATA_DECODE1_METRICS_PORT:-9472}" \
  "kvstore ${KVSTRATA_KVSTORE_METRICS_PORT:-9461}"; do
  read -r name port <<<"$endpoint"
  echo "  $name  http://127.0.0.1:$port/metrics"
  { curl -sf --max-time 5 "http://127.0.0.1:$port/metrics" || true; } |
    grep -E '^kvstrata_' | grep -vE '_(bucket|sum|count)[{ ]' | head -n 8 |
    sed 's/^/    /' || true
done

if ((keep_running)); then
  echo
  echo "The cluster keeps running (scripts/cluster.sh status); stop it with: scripts/cluster.sh down"
fi

#!/usr/bin/env bash
# Runs a local kvstrata cluster on this machine's CPU, in the background: one kvstore, one router
# (--policy=prefix-affinity) and two decode workers that register with the router.
#
#   scripts/cluster.sh up       start what is not running, wait until every process is healthy
#   scripts/cluster.sh status   each process, its pid and its health
#   scripts/cluster.sh down     SIGTERM, wait, SIGKILL what is left after a timeout
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]                   binaries are taken from $BUILD_DIR/bin
#   KVSTRATA_CLUSTER_DIR [~/.cache/kvstrata/cluster]   logs (NAME.log) and pid files (NAME.pid)
#   KVSTRATA_ROUTER_PORT [50070]  KVSTRATA_ROUTER_METRICS_PORT [9470]
#   KVSTRATA_ROUTER_HTTP_PORT [8070]   the router's OpenAI-compatible HTTP front (0: off)
#   KVSTRATA_DECODE0_PORT [50071] KVSTRATA_DECODE0_METRICS_PORT [9471]
#   KVSTRATA_DECODE1_PORT [50072] KVSTRATA_DECODE1_METRICS_PORT [9472]
#   KVSTRATA_KVSTORE_PORT [50061] KVSTRATA_KVSTORE_METRICS_PORT [9461]
#   KVSTRATA_ROUTER_POLICY [prefix-affinity]   the router's --policy
#   KVSTRATA_CLUSTER_ROUTER [1]   0: no router; the decode workers run without --router (for
#                                 trying the workers and kvstore alone)
#   KVSTRATA_MODEL                model path for the router and workers (default: theirs)
#   KVSTRATA_KVSTORE_MB [512]     kvstore --capacity_mb
#   KVSTRATA_DECODE_KV_MB         each worker's --kv_cache_mb (default: the worker's own)
#   KVSTRATA_DECODE_DEVICE [cpu]  each worker's --device (cuda, cuda:N: both workers on that GPU)
#   KVSTRATA_DECODE_KV_FORMAT [int2]   each worker's --kv_format (codec: the history codec of
#                                 the model's rotation file, CPU only)
#   KVSTRATA_DECODE0_ARGS, KVSTRATA_DECODE1_ARGS   more flags for one worker (split on spaces),
#                                 e.g. --same_gpu_pages=copy
#   KVSTRATA_KVSTORE_DEVICE       the kvstore's --device (cuda, cuda:N: an HBM pool on that GPU,
#                                 the same-GPU transport for workers there); empty: host memory
#   KVSTRATA_KVSTORE_GPU_MB [4096] the kvstore's --gpu_capacity_mb with KVSTRATA_KVSTORE_DEVICE
#   KVSTRATA_CLUSTER_TIMEOUT [120]       seconds `up` waits for each process to become healthy
#   KVSTRATA_CLUSTER_STOP_TIMEOUT [20]   seconds `down` waits after SIGTERM before SIGKILL
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${BUILD_DIR:-build}/bin
dir=${KVSTRATA_CLUSTER_DIR:-$HOME/.cache/kvstrata/cluster}
host=127.0.0.1
router_port=${KVSTRATA_ROUTER_PORT:-50070}
router_metrics=${KVSTRATA_ROUTER_METRICS_PORT:-9470}
router_http=${KVSTRATA_ROUTER_HTTP_PORT:-8070}
decode0_port=${KVSTRATA_DECODE0_PORT:-50071}
decode0_metrics=${KVSTRATA_DECODE0_METRICS_PORT:-9471}
decode1_port=${KVSTRATA_DECODE1_PORT:-50072}
decode1_metrics=${KVSTRATA_DECODE1_METRICS_PORT:-9472}
kvstore_port=${KVSTRATA_KVSTORE_PORT:-50061}
kvstore_metrics=${KVSTRATA_KVSTORE_METRICS_PORT:-9461}
with_router=${KVSTRATA_CLUSTER_ROUTER:-1}
start_timeout=${KVSTRATA_CLUSTER_TIMEOUT:-120}
stop_timeout=${KVSTRATA_CLUSTER_STOP_TIMEOUT:-20}

# Start order; `down` stops in reverse (workers leave the router before it goes).
names=(kvstore)
[[ $with_router != 0 ]] && names+=(router)
names+=(decode-0 decode-1)

# name -> binary, gRPC port, metrics port, service whose health means "ready".
binary_of() {
  case $1 in
    kvstore) echo kvstrata-kvstore ;;
    router) echo kvstrata-router ;;
    decode-*) echo kvstrata-decode ;;
  esac
}
port_of() {
  case $1 in
    kvstore) echo "$kvstore_port" ;;
    router) echo "$router_port" ;;
    decode-0) echo "$decode0_port" ;;
    decode-1) echo "$decode1_port" ;;
  esac
}
metrics_port_of() {
  case $1 in
    kvstore) echo "$kvstore_metrics" ;;
    router) echo "$router_metrics" ;;
    decode-0) echo "$decode0_metrics" ;;
    decode-1) echo "$decode1_metrics" ;;
  esac
}
service_of() {
  case $1 in
    kvstore) echo kvstrata.v1.KvStore ;;
    *) echo kvstrata.v1.Generation ;;
  esac
}

args_of() {
  local name=$1 model=()
  [[ -n ${KVSTRATA_MODEL:-} ]] && model=(--model="$KVSTRATA_MODEL")
  # Plaintext on loopback, said so by each process's start-up log ("gRPC transport: plaintext");
  # docs/operations.md ("Security") shows the TLS flags a real deployment passes instead.
  local common=(--insecure --listen="$host:$(port_of "$name")" --metrics_listen="$host:$(metrics_port_of "$name")")
  case $name in
    kvstore)
      local device=()
      [[ -n ${KVSTRATA_KVSTORE_DEVICE:-} ]] && device=(--device="$KVSTRATA_KVSTORE_DEVICE"
        --gpu_capacity_mb="${KVSTRATA_KVSTORE_GPU_MB:-4096}" --pool_socket="$dir/kvstore.pool")
      echo "${common[@]}" --capacity_mb="${KVSTRATA_KVSTORE_MB:-512}" --store_id=kvstore-0 "${device[@]}" ;;
    router)
      echo "${common[@]}" "${model[@]}" --policy="${KVSTRATA_ROUTER_POLICY:-prefix-affinity}" --router_id=router-0 \
        --kvstore="$host:$kvstore_port" --http_port="$router_http" ;;
    decode-*)
      local router=() kv_mb=() extra=()
      [[ $with_router != 0 ]] && router=(--router="$host:$router_port")
      [[ -n ${KVSTRATA_DECODE_KV_MB:-} ]] && kv_mb=(--kv_cache_mb="$KVSTRATA_DECODE_KV_MB")
      local extra_var="KVSTRATA_DECODE${name#decode-}_ARGS"
      [[ -n ${!extra_var:-} ]] && read -r -a extra <<<"${!extra_var}"
      echo "${common[@]}" "${model[@]}" --worker_id="$name" --kv_format="${KVSTRATA_DECODE_KV_FORMAT:-int2}" "${kv_mb[@]}" \
        --device="${KVSTRATA_DECODE_DEVICE:-cpu}" --kvstore="$host:$kvstore_port" "${router[@]}" \
        "${extra[@]}" ;;
  esac
}

pid_file() { echo "$dir/$1.pid"; }
log_file() { echo "$dir/$1.log"; }

# The pid of a running process started by us, or nothing (a stale pid file is ignored, and a
# reused pid is told apart by the process's executable name).
running_pid() {
  local file pid
  file=$(pid_file "$1")
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(binary_of "$1" | cut -c1-15)" ]] || return 0
  echo "$pid"
}

healthy() {  # name [timeout_ms]
  "$bin/kvstrata" health --target="$host:$(port_of "$1")" --service="$(service_of "$1")" \
    --timeout_ms="${2:-1000}" >/dev/null 2>&1
}

fail_with_log() {  # name message
  local log
  log=$(log_file "$1")
  echo "cluster: $1: $2; last lines of $log:" >&2
  tail -n 20 "$log" 2>/dev/null | sed 's/^/  | /' >&2
  echo "cluster: stop what did start with: scripts/cluster.sh down" >&2
  exit 1
}

wait_healthy() {
  local name=$1 pid=$2 deadline=$((SECONDS + start_timeout))
  until healthy "$name" 1000; do
    kill -0 "$pid" 2>/dev/null || fail_with_log "$name" "exited during start-up"
    ((SECONDS < deadline)) || fail_with_log "$name" "not healthy after ${start_timeout}s"
    sleep 0.5
  done
}

start() {
  local name=$1 pid binary log
  pid=$(running_pid "$name")
  if [[ -n $pid ]]; then
    echo "cluster: $name already running (pid $pid)"
    return
  fi
  binary=$bin/$(binary_of "$name")
  [[ -x $binary ]] || { echo "cluster: $binary not found; build it: scripts/build.sh $(binary_of "$name")" >&2; exit 1; }
  log=$(log_file "$name")
  echo "--- scripts/cluster.sh: starting $name at $(date '+%F %T') ---" >>"$log"
  # One engine thread per worker (the engine follows OPENBLAS_NUM_THREADS): two workers share
  # two cores.
  # shellcheck disable=SC2046  # args_of prints flags without spaces in them
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 setsid "$binary" $(args_of "$name") \
    >>"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$(pid_file "$name")"
  echo "cluster: started $name (pid $pid), log $log"
  wait_healthy "$name" "$pid"
}

endpoints() {
  local name
  for name in "${names[@]}"; do
    printf '  %-9s grpc %s:%-6s metrics http://%s:%s/metrics\n' "$name" "$host" \
      "$(port_of "$name")" "$host" "$(metrics_port_of "$name")"
  done
  if [[ $with_router != 0 && $router_http != 0 ]]; then
    printf '  OpenAI API  http://%s:%s/v1  (e.g. OPENAI_BASE_URL=http://%s:%s/v1)\n' "$host" \
      "$router_http" "$host" "$router_http"
  fi
}

up() {
  [[ -x $bin/kvstrata ]] || { echo "cluster: $bin/kvstrata not found; run scripts/build.sh" >&2; exit 1; }
  mkdir -p "$dir"
  local name all_up=1
  for name in "${names[@]}"; do
    [[ -n $(running_pid "$name") ]] && healthy "$name" || all_up=0
  done
  if ((all_up)); then
    echo "cluster: already up"
    endpoints
    return
  fi
  for name in "${names[@]}"; do
    start "$name"
    echo "cluster: $name healthy"
  done
  echo "cluster: up (logs and pid files in $dir)"
  endpoints
}

stop() {
  local name=$1 pid deadline
  pid=$(running_pid "$name")
  if [[ -z $pid ]]; then
    rm -f "$(pid_file "$name")"
    return
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + stop_timeout))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "cluster: $name (pid $pid) still running ${stop_timeout}s after SIGTERM; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  else
    echo "cluster: stopped $name (pid $pid)"
  fi
  rm -f "$(pid_file "$name")"
}

down() {
  local i
  # The router too when KVSTRATA_CLUSTER_ROUTER=0 now but it was started earlier.
  local all=(kvstore router decode-0 decode-1)
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do stop "${all[i]}"; done
  echo "cluster: down"
}

status() {
  local name pid health any=0
  for name in kvstore router decode-0 decode-1; do
    pid=$(running_pid "$name")
    if [[ -z $pid ]]; then
      [[ $name == router && $with_router == 0 ]] && continue
      printf '  %-9s stopped\n' "$name"
      continue
    fi
    any=1
    if healthy "$name" 1000; then health=SERVING; else health="NOT SERVING"; fi
    printf '  %-9s pid %-8s %-12s grpc %s:%-6s metrics http://%s:%s/metrics\n' "$name" "$pid" \
      "$health" "$host" "$(port_of "$name")" "$host" "$(metrics_port_of "$name")"
  done
  ((any)) || echo "cluster: not running"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *)
    echo "usage: scripts/cluster.sh up|down|status   (see the comment at the top for settings)" >&2
    exit 2
    ;;
esac

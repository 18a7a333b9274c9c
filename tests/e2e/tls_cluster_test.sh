#!/usr/bin/env bash
# The three binaries over mTLS, as deploy/k8s runs them: certificates from
# tests/testing/make_test_certs.sh, API keys, a page MAC key, plaintext health-only ports.
# Checks that the worker registers with the router and publishes to the kvstore over TLS, that
# a request needs an API key, that a client cannot reach a worker around the router, and that
# each process says "TLS" in its log. Usage: tls_cluster_test.sh BIN_DIR (needs the model).
set -euo pipefail
bin=$1
model=${KVSTRATA_MODEL:?KVSTRATA_MODEL must name the model}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do echo "== $f" >&2; tail -5 "$f" >&2; done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$(dirname "$0")/../testing/make_test_certs.sh" "$work/certs"
c=$work/certs
tls() { echo --tls_cert="$c/$1.pem" --tls_key="$c/$1.key" --tls_ca="$c/ca.pem" --tls_server_name=kvstrata-peer; }
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/page-mac.keys"
echo -n tenant-a-key | "$bin/kvstrata" hash-api-key --tenant=acme > "$work/api-keys.txt"

kv=$(free_port) kv_health=$(free_port) kv_metrics=$(free_port) router=$(free_port) router_health=$(free_port)
decode=$(free_port) decode_health=$(free_port)
"$bin/kvstrata-kvstore" --listen=127.0.0.1:$kv --metrics_listen=127.0.0.1:$kv_metrics --health_listen=127.0.0.1:$kv_health \
  $(tls kvstore) > "$work/kvstore.log" 2>&1 &
pids+=($!)
"$bin/kvstrata-router" --listen=127.0.0.1:$router --metrics_listen= --model="$model" \
  --health_listen=127.0.0.1:$router_health --kvstore=127.0.0.1:$kv \
  --api_keys_file="$work/api-keys.txt" $(tls router) > "$work/router.log" 2>&1 &
pids+=($!)
"$bin/kvstrata" health --target=127.0.0.1:$router_health --timeout_ms=30000 >/dev/null ||
  fail "router not healthy"
"$bin/kvstrata-decode" --listen=127.0.0.1:$decode --metrics_listen= --model="$model" \
  --health_listen=127.0.0.1:$decode_health --kvstore=127.0.0.1:$kv --router=127.0.0.1:$router \
  --local_cache_mb=0 --page_mac_key_file="$work/page-mac.keys" $(tls worker) \
  > "$work/decode.log" 2>&1 &
pids+=($!)
for port in $kv_health $decode_health; do
  "$bin/kvstrata" health --target=127.0.0.1:$port --timeout_ms=60000 >/dev/null ||
    fail "port $port not healthy"
done
for log in kvstore router decode; do
  grep -q "gRPC transport: TLS" "$work/$log.log" || fail "$log does not log TLS"
done
deadline=$((SECONDS + 30))
until grep -q "registered with router" "$work/decode.log"; do
  ((SECONDS < deadline)) || fail "the worker did not register over TLS"
  sleep 0.2
done

client=(--target=127.0.0.1:$router --tls_ca="$c/ca.pem" --tls_server_name=kvstrata-peer
        --max_tokens=4 --prompt="$(printf 'The cache is shared by every tenant. %.0s' $(seq 1 30))")
if "$bin/kvstrata" request "${client[@]}" > /dev/null 2> "$work/anonymous.err"; then
  fail "a request without an API key was served"
fi
grep -q UNAUTHENTICATED "$work/anonymous.err" || fail "no UNAUTHENTICATED: $(cat "$work/anonymous.err")"
"$bin/kvstrata" request "${client[@]}" --api_key=tenant-a-key > /dev/null 2> "$work/ok.err" ||
  fail "the tenant's request failed: $(cat "$work/ok.err")"

# Straight to the worker with a worker (not router) certificate: refused.
if "$bin/kvstrata" request --target=127.0.0.1:$decode $(tls worker) --max_tokens=2 --prompt=hi \
    > /dev/null 2> "$work/direct.err"; then
  fail "a worker served a caller without the router role"
fi
grep -q "PERMISSION_DENIED.*router role" "$work/direct.err" || fail "$(cat "$work/direct.err")"

# The worker published the prompt's pages over mTLS, MACed: the kvstore took the Put.
pages() { curl -sf "http://127.0.0.1:$kv_metrics/metrics" | awk '$1 == "kvstrata_kvstore_pages" {print $2}'; }
deadline=$((SECONDS + 20))
until [[ $(pages) != 0 && -n $(pages) ]]; do
  ((SECONDS < deadline)) || fail "no page reached the kvstore over mTLS"
  sleep 0.2
done
echo "tls_cluster_test: ok"

#!/usr/bin/env bash
# Makes every Secret the kvstrata manifests mount, with openssl, in namespace $1 (default
# kvstrata): a cluster CA and the certificates kvstrata-{kvstore,decode,router}-tls (tls.crt,
# tls.key, ca.crt; or use cert-manager.yaml beside this file for those), the pool's page MAC key
# kvstrata-page-mac, and kvstrata-api-keys with one tenant, "default", whose API key is printed
# once and kept nowhere else. docs/operations.md ("Security") explains each.
set -euo pipefail
ns=${1:-kvstrata}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -keyout ca.key -out ca.crt -subj /CN=kvstrata-ca 2>/dev/null
cert() {  # component, extra SANs
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" \
    -out "$1.csr" -subj "/CN=kvstrata-$1" 2>/dev/null
  printf 'subjectAltName=DNS:kvstrata-%s,DNS:kvstrata-peer%s\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$1" "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 90 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  kubectl -n "$ns" create secret generic "kvstrata-$1-tls" --from-file=tls.crt="$1.crt" \
    --from-file=tls.key="$1.key" --from-file=ca.crt=ca.crt
}
cert kvstore ",DNS:*.kvstore"
cert decode ""
cert router ",DNS:router,DNS:router.$ns.svc,DNS:router.$ns.svc.cluster.local"

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > page-mac.keys
echo >> page-mac.keys
kubectl -n "$ns" create secret generic kvstrata-page-mac --from-file=page-mac.keys

api_key=$(head -c 32 /dev/urandom | base64 | tr -d '=+/\n')
printf 'default %s\n' "$(printf '%s' "$api_key" | sha256sum | cut -d' ' -f1)" > api-keys.txt
kubectl -n "$ns" create secret generic kvstrata-api-keys --from-file=api-keys.txt
echo "API key of tenant \"default\" (shown once): $api_key"
echo "CA for clients of the router: kubectl -n $ns get secret kvstrata-router-tls -o jsonpath='{.data.ca\\.crt}' | base64 -d"

#!/usr/bin/env bash
# Makes the certificates the security tests use, with the openssl CLI, into the folder $1:
#   ca.pem / ca.key            the cluster CA
#   other-ca.pem / other-ca.key another CA, which nobody trusts
#   kvstore.pem/.key           server: CN kvstrata-kvstore, SAN DNS:localhost, IP:127.0.0.1
# Every leaf also names kvstrata-peer, the name the services expect of each other
# (--tls_server_name), as in deploy/k8s.
#   kvstore-next.pem/.key      the same server's renewed certificate (CN kvstrata-kvstore-next)
#   worker.pem/.key            client: CN and SAN kvstrata-decode (the worker role)
#   router.pem/.key            client: CN and SAN kvstrata-router (no worker role)
#   expired.pem/.key           a worker certificate that expired yesterday
#   rogue.pem/.key             a worker certificate from other-ca
# P-256 keys: fast to make (the whole set takes well under a second).
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() {  # name
  key "$1"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
}

cert() {  # name ca cn san days
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days "$5" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca
ca other-ca
cert kvstore ca kvstrata-kvstore "DNS:localhost,DNS:kvstrata-peer,IP:127.0.0.1" 2
cert kvstore-next ca kvstrata-kvstore-next "DNS:localhost,IP:127.0.0.1" 2
cert worker ca kvstrata-decode "DNS:kvstrata-decode,DNS:kvstrata-peer" 2
cert router ca kvstrata-router "DNS:kvstrata-router,DNS:kvstrata-peer" 2
cert expired ca kvstrata-decode "DNS:kvstrata-decode" -1
cert rogue other-ca kvstrata-decode "DNS:kvstrata-decode" 2

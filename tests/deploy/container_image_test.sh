#!/usr/bin/env bash
# Builds the CPU image with scripts/build-image.sh (reusing the cached root filesystem) and runs
# it: each binary's --help as the non-root user, then kvstrata-kvstore inside the image, checked
# for health from the host with `kvstrata health` and for its uid through /proc.
#
#   tests/deploy/container_image_test.sh BIN_DIR
#
# Exit 77 (a CTest skip) where buildah or debootstrap cannot run: not root, tool missing, or
# buildah unusable (e.g. no user namespaces or chroot); and where the binaries were built with
# CUDA (nvcc present): the CPU image holds CPU builds (KVSTRATA_CUDA=OFF, as Containerfile.cpu
# compiles them), which need none of the CUDA libraries it lacks.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=$(cd "${1:?usage: container_image_test.sh BIN_DIR}" && pwd)
storage_driver=${KVSTRATA_STORAGE_DRIVER:-vfs}
tag=localhost/kvstrata:container-test
uid=10001

skip() { echo "SKIP container_image_test: $*"; exit 77; }
fail() { echo "FAIL container_image_test: $*" >&2; exit 1; }
bh() { buildah --storage-driver "$storage_driver" "$@"; }

[[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap and chroot build the image)"
libs=$(ldd "$bin_dir"/kvstrata* 2>/dev/null || true)
if [[ $libs == *libcudart* ]]; then
  skip "the binaries in $bin_dir link CUDA; the CPU image takes a KVSTRATA_CUDA=OFF build"
fi
command -v buildah >/dev/null || skip "buildah not installed (scripts/install-deps.sh)"
command -v debootstrap >/dev/null || skip "debootstrap not installed (scripts/install-deps.sh)"
probe=$(bh from --quiet scratch 2>&1) || skip "buildah cannot create a container here: $probe"
bh rm "$probe" >/dev/null

containers=()
server_pid=
work=$(mktemp -d)
cleanup() {
  [[ -z $server_pid ]] || kill -KILL "$server_pid" 2>/dev/null || true
  for c in "${containers[@]}"; do bh rm "$c" >/dev/null 2>&1 || true; done
  bh rmi "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== building $tag"
t0=$SECONDS
"$repo/scripts/build-image.sh" --bin-dir "$bin_dir" --tag "$tag"
echo "== image built in $((SECONDS - t0)) s"

# The configuration a pod relies on.
user=$(bh inspect --type image --format '{{.OCIv1.Config.User}}' "$tag")
[[ $user == "$uid:$uid" ]] || fail "image user is '$user', want $uid:$uid"
cfg=$(bh inspect --type image --format '{{.OCIv1.Config.ExposedPorts}} {{.OCIv1.Config.Env}}' "$tag")
for want in 50070/tcp 8070/tcp 9470/tcp 50071/tcp 9471/tcp 50061/tcp 9461/tcp \
  KVSTRATA_ROTATIONS=/usr/share/kvstrata/rotations KVSTRATA_CACHE=/var/lib/kvstrata/cache; do
  [[ $cfg == *"$want"* ]] || fail "image config lacks $want: $cfg"
done
title=$(bh inspect --type image \
  --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.title"}}' "$tag")
[[ $title == kvstrata ]] || fail "label org.opencontainers.image.title is '$title'"

ctr=$(bh from --quiet "$tag")
containers+=("$ctr")
run_in() { bh run --isolation chroot --user "$uid:$uid" "$ctr" -- "$@"; }

echo "== the default user"
got=$(bh run --isolation chroot "$ctr" -- id -u)
[[ $got == "$uid" ]] || fail "id -u in the image (no --user) is '$got', want $uid"

echo "== --help of each binary"
for b in kvstrata kvstrata-router kvstrata-decode kvstrata-kvstore; do
  # kvstrata's usage goes to stdout with exit 0; absl's --help exits 1, so only the text counts.
  out=$(run_in "$b" --help 2>"$work/help.err" || true)
  [[ $out == *"$b"* ]] || fail "$b --help in the image does not name $b:
$out
$(cat "$work/help.err")"
  echo "$b: $(head -n 1 <<<"$out")"
done

echo "== rotation files where KVSTRATA_ROTATIONS points"
run_in sh -c 'ls "$KVSTRATA_ROTATIONS"' | grep -q . || fail "no files under KVSTRATA_ROTATIONS"

echo "== kvstrata-kvstore inside the image, health from the host"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
# Chroot isolation shares the host's network, so a loopback port is reachable from here.
run_in kvstrata-kvstore --insecure --listen="127.0.0.1:$port" --metrics_listen="127.0.0.1:$metrics_port" \
  >"$work/kvstore.log" 2>&1 &
server_pid=$!
"$bin_dir/kvstrata" health --target="127.0.0.1:$port" --service=kvstrata.v1.KvStore \
  --timeout_ms=60000 || { cat "$work/kvstore.log" >&2; fail "kvstore in the image not healthy"; }

# The server process is a descendant of `buildah run`; its real uid comes from /proc.
descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1"); do echo "$p"; descendants "$p"; done
}
kvstore_pid=
for p in $(descendants "$server_pid"); do
  [[ $(cat "/proc/$p/comm" 2>/dev/null) == kvstrata-kvstor* ]] && kvstore_pid=$p
done
[[ -n $kvstore_pid ]] || fail "kvstrata-kvstore not found under buildah run (pid $server_pid)"
real_uid=$(awk '/^Uid:/ { print $2 }' "/proc/$kvstore_pid/status")
[[ $real_uid == "$uid" ]] || fail "kvstrata-kvstore runs as uid $real_uid, want $uid"
echo "kvstrata-kvstore pid $kvstore_pid serving as uid $real_uid"

echo "== stopping it with SIGTERM"
kill -TERM "$kvstore_pid"
for _ in $(seq 100); do
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$server_pid" 2>/dev/null; then
  cat "$work/kvstore.log" >&2
  fail "kvstrata-kvstore did not stop within 10 s of SIGTERM"
fi
rc=0
wait "$server_pid" || rc=$?
server_pid=
[[ $rc -eq 0 ]] || { cat "$work/kvstore.log" >&2; fail "buildah run of kvstrata-kvstore exited $rc"; }
cat "$work/kvstore.log"
echo "PASS container_image_test"

#!/usr/bin/env bash
# Builds the CPU container image without a registry or a daemon: a Debian bookworm root
# filesystem made with debootstrap (minbase) plus the runtime packages of
# deploy/containers/runtime-packages.txt, the four binaries and rotations/, committed with buildah
# (chroot isolation, vfs storage) into local storage. Needs root (debootstrap, chroot).
#
#   scripts/build-image.sh [--tag NAME] [--push REF] [--save FILE.tar] [--bin-dir DIR]
#                          [--refresh-rootfs]
#
# The root filesystem is cached as a tarball under ${KVSTRATA_CACHE:-~/.cache/kvstrata}/images/,
# keyed by the package list and the recipe, so only the first build downloads packages;
# --refresh-rootfs rebuilds it (to pick up Debian security updates). Layout of the image:
# docs/operations.md, "Container images".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

tag=localhost/kvstrata:cpu
push_ref=
save_file=
bin_dir=
refresh=0
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    --tag=*) tag=${1#*=}; shift ;;
    --push) push_ref=${2:?--push needs REGISTRY/NAME:TAG}; shift 2 ;;
    --push=*) push_ref=${1#*=}; shift ;;
    --save) save_file=${2:?--save needs a file name}; shift 2 ;;
    --save=*) save_file=${1#*=}; shift ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a folder}; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --refresh-rootfs) refresh=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

suite=bookworm
mirror=${KVSTRATA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${KVSTRATA_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
storage_driver=${KVSTRATA_STORAGE_DRIVER:-vfs}
images_dir=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/images
uid=10001
binaries=(kvstrata kvstrata-router kvstrata-decode kvstrata-kvstore)

die() { echo "build-image: $*" >&2; exit 1; }
start=$SECONDS
step() { printf 'build-image: [%3ds] %s\n' $((SECONDS - start)) "$*"; }
bh() { buildah --storage-driver "$storage_driver" "$@"; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap and chroot build the root filesystem)"
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || die "$tool not found; scripts/install-deps.sh installs it"
done

# 1. Binaries.
if [[ -z $bin_dir ]]; then
  step "building ${binaries[*]} (scripts/build.sh)"
  scripts/build.sh "${binaries[@]}"
  bin_dir=${BUILD_DIR:-build}/bin
fi
for b in "${binaries[@]}"; do
  [[ -x $bin_dir/$b ]] || die "$bin_dir/$b missing; build it with scripts/build.sh $b"
done

# 2. Root filesystem tarball, cached by what goes into it.
mapfile -t packages < <(sed 's/#.*//; /^[[:space:]]*$/d; s/[[:space:]]//g' \
  deploy/containers/runtime-packages.txt | sort -u)
((${#packages[@]})) || die "deploy/containers/runtime-packages.txt lists no packages"
# Bump the recipe version when the steps below change what ends up in the tarball.
key=$(printf '%s\n' recipe=2 "$suite" "$mirror" "$security_mirror" "uid=$uid" "${packages[@]}" |
  sha256sum | cut -c1-16)
rootfs_tar=$images_dir/rootfs-$suite-$key.tar
mkdir -p "$images_dir"
exec 9>"$rootfs_tar.lock"
flock 9  # two builds at once share one debootstrap run

build_rootfs() {
  local work root log
  work=$(mktemp -d "$images_dir/rootfs-work.XXXXXX")
  root=$work/root
  log=$rootfs_tar.log
  : >"$log"
  trap 'rm -rf "$work"' RETURN
  step "debootstrap --variant=minbase $suite from $mirror (log: $log)"
  # One progress line per debootstrap phase instead of one per package.
  if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" 2>&1 | tee -a "$log" |
    awk '/^I: / && !seen[$2]++ { print "build-image:        debootstrap: " $2 " ..."; fflush() }'; then
    tail -n 20 "$log" >&2
    die "debootstrap failed; full log in $log"
  fi
  [[ -x $root/usr/bin/apt-get ]] || { tail -n 20 "$log" >&2; die "debootstrap failed; full log in $log"; }
  cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
EOF
  step "installing ${#packages[@]} runtime packages and updates into the root filesystem"
  local in_root=(env DEBIAN_FRONTEND=noninteractive chroot "$root")
  if ! {
    "${in_root[@]}" apt-get update -q &&
      "${in_root[@]}" apt-get upgrade -y -q &&
      "${in_root[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}"
  } >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "apt-get in the root filesystem failed; full log in $log"
  fi
  "${in_root[@]}" groupadd --gid "$uid" kvstrata
  "${in_root[@]}" useradd --uid "$uid" --gid "$uid" --home-dir /var/lib/kvstrata \
    --no-create-home --no-log-init --shell /usr/sbin/nologin kvstrata
  install -d -o "$uid" -g "$uid" "$root/var/lib/kvstrata" "$root/var/lib/kvstrata/cache"
  "${in_root[@]}" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/apt/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/tmp/*
  # The package list inside the tarball, for `cat /etc/kvstrata-packages` when debugging.
  "${in_root[@]}" dpkg-query -W -f='${Package} ${Version}\n' >"$root/etc/kvstrata-packages"
  step "packing the root filesystem into $rootfs_tar"
  tar --numeric-owner --xattrs -C "$root" -cf "$work/rootfs.tar" .
  mv "$work/rootfs.tar" "$rootfs_tar"
}
if [[ $refresh -eq 1 || ! -f $rootfs_tar ]]; then
  build_rootfs
else
  step "reusing cached root filesystem $rootfs_tar"
fi
exec 9>&-

# 3. The image: root filesystem, stripped binaries, rotation files, configuration.
stage=$(mktemp -d)
ctr=
cleanup() {
  rm -rf "$stage"
  [[ -z $ctr ]] || bh rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
step "assembling the image (buildah, $storage_driver storage)"
ctr=$(bh from --quiet scratch)
bh add --quiet "$ctr" "$rootfs_tar" / >/dev/null
mkdir -p "$stage/bin"
for b in "${binaries[@]}"; do
  # Debug info is most of a RelWithDebInfo binary; symbols stay for readable backtraces.
  strip --strip-debug -o "$stage/bin/$b" "$bin_dir/$b"
done
bh add --quiet --chown 0:0 "$ctr" "$stage/bin" /usr/local/bin/ >/dev/null
bh add --quiet --chown 0:0 "$ctr" "$repo/rotations" /usr/share/kvstrata/rotations >/dev/null

# A library missing from runtime-packages.txt shows up here, not in a pod.
missing=$(bh run --isolation chroot "$ctr" -- sh -c \
  'ldd /usr/local/bin/* | grep "not found" || true')
[[ -z $missing ]] || die "libraries missing in the image (add their packages to deploy/containers/runtime-packages.txt):
$missing"

revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain 2>/dev/null | head -1) ]] || revision=$revision-dirty
labels=(
  org.opencontainers.image.title=kvstrata
  "org.opencontainers.image.description=kvstrata LLM serving (CPU): router, decode worker, kvstore and the kvstrata CLI"
  org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  org.opencontainers.image.revision="$revision"
  org.opencontainers.image.version="$revision"
  org.opencontainers.image.base.name=debian:$suite-minbase
  org.opencontainers.image.vendor=kvstrata
)
config=(
  --user "$uid:$uid" --workingdir /var/lib/kvstrata
  --env HOME=/var/lib/kvstrata
  --env KVSTRATA_CACHE=/var/lib/kvstrata/cache
  --env KVSTRATA_ROTATIONS=/usr/share/kvstrata/rotations
  --entrypoint '[]' --cmd '["kvstrata", "help"]'
)
for port in 50070 8070 9470 50071 9471 50061 9461; do config+=(--port "$port/tcp"); done
for l in "${labels[@]}"; do config+=(--label "$l"); done
bh config "${config[@]}" "$ctr"
step "committing $tag"
bh commit --quiet --rm "$ctr" "$tag" >/dev/null
ctr=

# 4. Optional copies elsewhere.
if [[ -n $push_ref ]]; then
  case $push_ref in
    docker://* | oci:* | oci-archive:* | docker-archive:* | dir:* | containers-storage:*) ;;
    *) push_ref=docker://$push_ref ;;
  esac
  step "pushing to $push_ref"
  bh push "$tag" "$push_ref"
fi
if [[ -n $save_file ]]; then
  step "saving to $save_file (oci-archive)"
  rm -f "$save_file"
  bh push --quiet "$tag" "oci-archive:$save_file:$tag"
fi
step "done: $tag ($(bh images --noheading --format '{{.Size}}' "$tag" 2>/dev/null | head -1))"

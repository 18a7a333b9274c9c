#!/usr/bin/env bash
# Plots and a side-by-side table of kvstrata-loadtest runs (loadtest/plot_report.py says what).
# Creates (once) the plotting venv with the pinned matplotlib of scripts/plot-requirements.txt
# under ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}.
#   loadtest/report.sh OUT_DIR RUN.json [RUN.json ...]
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OUT_DIR RUN.json [RUN.json ...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
venv=$cache/venv-plot
requirements=$here/../scripts/plot-requirements.txt
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$requirements" "$venv/.requirements"; then
  echo "loadtest/report: creating $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
  cp "$requirements" "$venv/.requirements"
fi
exec "$venv/bin/python" "$here/plot_report.py" "$@"

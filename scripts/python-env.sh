#!/usr/bin/env bash
# Creates (once) the test-only Python environment with pinned packages used by the reference
# implementations in tests/, and prints the path of its interpreter.
#   ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/venv-test
set -euo pipefail
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
venv=$cache/venv-test
requirements="$(cd "$(dirname "$0")" && pwd)/../tests/python-requirements.txt"
stamp=$venv/.requirements
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$requirements" "$stamp"; then
  echo "python-env: creating $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
  cp "$requirements" "$stamp"
fi
echo "$venv/bin/python"

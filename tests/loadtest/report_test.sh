#!/usr/bin/env bash
# loadtest/report.sh on two committed runs (tests/loadtest/data/report_*.json): every plot comes
# out as a PNG of the size the script draws, and compare.md holds each run's figures as the
# JSON gives them. Skips (77) when the pinned plotting venv is not there and cannot be made
# (pip cannot reach PyPI); a failure with the venv in place fails.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
data=$repo/tests/loadtest/data
venv=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/venv-plot
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ready=0
[[ -x $venv/bin/python ]] && cmp -s "$repo/scripts/plot-requirements.txt" "$venv/.requirements" &&
  ready=1
# Offline, pip gives up after one short try instead of retrying for minutes.
export PIP_DEFAULT_TIMEOUT=10 PIP_RETRIES=0
if ! "$repo/loadtest/report.sh" "$out/report" "$data/report_docqa.json" \
    "$data/report_stages.json" >"$out/log" 2>&1; then
  if ((!ready)); then
    echo "report_test: SKIP: the plotting venv $venv could not be made (offline?):"
    tail -5 "$out/log"
    exit 77
  fi
  cat "$out/log"
  echo "report_test: FAIL: loadtest/report.sh failed with its venv in place"
  exit 1
fi

python3 - "$out/report" "$data/report_docqa.json" "$data/report_stages.json" <<'PY'
import json, os, struct, sys

out, paths = sys.argv[1], sys.argv[2:]
failed = []

def check(cond, what):
    if not cond:
        failed.append(what)

# figsize x dpi 110, as plot_report.py draws them.
for name, size in [("latency.png", (1650, 440)), ("over_time.png", (1650, 440)),
                   ("workers.png", (880, 440)), ("stages.png", (1320, 440))]:
    path = os.path.join(out, name)
    if not os.path.exists(path):
        failed.append(f"{name} missing")
        continue
    with open(path, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG")
    check(struct.unpack(">II", head[16:24]) == size,
          f"{name} is {struct.unpack('>II', head[16:24])}, expected {size}")
    check(os.path.getsize(path) > 10000, f"{name} is {os.path.getsize(path)} bytes: blank?")

table = open(os.path.join(out, "compare.md")).read().splitlines()
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table[2:]}
labels = [c.strip() for c in table[0].split("|")[2:-1]]
check(labels == ["report_docqa", "report_stages"], f"header {labels}")
for i, p in enumerate(paths):
    s = json.load(open(p))["summary"]
    check(rows["requests OK / measured"][i] == f"{s['ok']} / {s['requests']}",
          f"run {i}: requests {rows['requests OK / measured'][i]}")
    check(rows["hit ratio"][i] == f"{100 * s['hit_ratio']:.1f} %", f"run {i}: hit ratio")
    check(rows["TTFT p50 / p99 ms"][i] ==
          f"{s['ttft_ms']['p50']:.0f} / {s['ttft_ms']['p99']:.0f}", f"run {i}: TTFT")
if failed:
    print("report_test: FAIL:\n  " + "\n  ".join(failed))
    sys.exit(1)
print("report_test: 4 PNGs and compare.md as expected")
PY

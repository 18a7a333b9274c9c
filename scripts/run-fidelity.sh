#!/usr/bin/env bash
# Reproduces docs/fidelity.md: fetches the model and the text, fits the rotation files (the
# committed default under rotations/ and the ablations under the cache folder), evaluates every
# KV format at 1K-8K context, and plots the result. About 15 min of calibration and 30-40 min of
# evaluation on 2 CPU cores, plus about 1 h for round 2 and 1 h for its calibration-chosen
# boosts (docs/fidelity.md), about 2.5 h for round 3 (docs/fidelity.md, "Round 3"), about
# 25 min for round 5 and 35-80 min for round 6 (its calibration).
#   scripts/run-fidelity.sh [OUT_DIR]      (default: docs/)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs}
kv=${KVSTRATA:-build/bin/kvstrata}
cache=${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}
r=$cache/rotations
mkdir -p "$r" rotations "$out"
scripts/fetch-model.sh >/dev/null
scripts/fetch-text.sh >/dev/null

# The default, committed rotation file: per (layer, KV head), values from VᵀSᵀSV.
"$kv" calibrate --out rotations/SmolLM2-135M-Instruct.safetensors
# Ablations (not committed): OSCAR's shared per-layer rotation, OSCAR's value proxy, clips for
# Lloyd-Max levels, and the Hadamard matrix alone with the same clip search.
"$kv" calibrate --shared-rotation --out "$r/SmolLM2-135M-Instruct.shared.safetensors"
"$kv" calibrate --value-proxy --out "$r/SmolLM2-135M-Instruct.proxy.safetensors"
"$kv" calibrate --lloyd-max --out "$r/SmolLM2-135M-Instruct.lloyd-max.safetensors"
"$kv" calibrate --hadamard-only --out "$r/SmolLM2-135M-Instruct.hadamard-clip.safetensors"

"$kv" eval \
  --rotations rotations/SmolLM2-135M-Instruct.safetensors \
  --shared-rotations "$r/SmolLM2-135M-Instruct.shared.safetensors" \
  --proxy-rotations "$r/SmolLM2-135M-Instruct.proxy.safetensors" \
  --lloyd-max-rotations "$r/SmolLM2-135M-Instruct.lloyd-max.safetensors" \
  --formats "fp8,int4,kivi2,turbo3,int2-naive,int2-hadamard,hadamard-clip=$r/SmolLM2-135M-Instruct.hadamard-clip.safetensors,oscar-shared,oscar,oscar-lm,oscar-proxy,oscar-nowin" \
  --contexts 1024,2048,4096,8192 --windows 4,2,1,1 \
  --json "$out/fidelity.json" | tee "$out/fidelity-table.txt"
scripts/plot-fidelity.sh "$out/fidelity.json" "$out/fidelity-kld.png"
# Finer INT2 groups (3.0 history bits).
"$kv" calibrate --group-size 32 --out "$r/SmolLM2-135M-Instruct.g32.safetensors"
"$kv" eval --group-size 32 --formats "oscar-g32=$r/SmolLM2-135M-Instruct.g32.safetensors" \
  --contexts 1024,2048,4096,8192 --windows 4,2,1,1 --json "$out/fidelity-g32.json"

# Round 2 (issue 19): candidate history codecs as evaluation formats (kernels/history_codec.h),
# on the committed rotation file. Exploration at 1K/2K (each file's formats are listed in the
# matching .formats file), then the confirmation at 1K-8K with enough windows for a bootstrap
# interval; scripts/fidelity_ci.py prints the tables of docs/fidelity.md, "Round 2".
rot=rotations/SmolLM2-135M-Instruct.safetensors
mkdir -p "$out/fidelity2"
for step in explore1 explore2 explore3 explore4; do
  "$kv" eval --rotations "$rot" --formats "$(cat docs/fidelity2/$step.formats)" \
    --contexts 1024,2048 --windows 4,2 --json "$out/fidelity2/$step.json" \
    > "$out/fidelity2/$step.txt"
done
# Confirmation at 4K and 8K (1K/2K: the exploration's windows), turbo3 against P2.
"$kv" eval --rotations "$rot" --formats "$(cat docs/fidelity2/confirm.formats)" \
  --contexts 4096 --windows 3 --json "$out/fidelity2/confirm-4k.json" > "$out/fidelity2/confirm-4k.txt"
"$kv" eval --rotations "$rot" --formats "$(cat docs/fidelity2/confirm.formats)" \
  --contexts 8192 --windows 2 --json "$out/fidelity2/confirm-8k.json" > "$out/fidelity2/confirm-8k.txt"
for s in split vboost; do
  "$kv" eval --rotations "$rot" --formats "$(cat docs/fidelity2/$s.formats)" \
    --contexts 8192 --windows 2 --json "$out/fidelity2/$s-8k.json" > "$out/fidelity2/$s-8k.txt"
done
# Round 2, calibration-chosen boosts: the per-layer key sensitivity under P2's base codec (and,
# as the ablation, under INT2) on the CALIBRATION text, the top 8 layers boosted from it, and
# those codecs evaluated on the same windows as turbo3 and P2 above.
base="4x16+3x16+2x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr"
boost="4x32+3x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr"
sensitivity() {  # FORMATS (the first one is ranked into the spec) TIERS SPEC_FILE JSON THREADS
  "$kv" eval --layer-sensitivity --rotations "$rot" --threads "$5" --formats "$1" \
    --contexts 2048 --windows 16 --attention-samples 32 --tier-base "$base" --rank-tiers "$2" \
    --spec-out "$3" --json "$4" > "${4%.json}.txt"
}
sensitivity "P2-K=codec:${base%|*}|bf16@$rot,oscar-K=codec:int2|bf16@$rot" "8=$boost" \
  "$out/fidelity2/P2c.codec" "$out/fidelity2/sensitivity-2k.json" 2
sensitivity "oscar-K=codec:int2|bf16@$rot" "8=$boost" "$out/fidelity2/P2c-o.codec" \
  "$out/fidelity2/sensitivity-2k-oscar.json" 1
echo "P2c=codec:$(cat "$out/fidelity2/P2c.codec")@$rot,P2c-o=codec:$(cat "$out/fidelity2/P2c-o.codec")@$rot" \
  > "$out/fidelity2/calib.formats"
# The per-layer next-token KL of P2's base keys (one forward pass per layer, about 14 min on
# two shared cores): P2k boosts its top 8; P2w spreads the same bits over five tiers of that
# ranking (counts from scripts/allocate_tiers.py's water-filling), read back from the report.
"$kv" eval --layer-sensitivity --rank-by next-token-kl --rotations "$rot" \
  --formats "P2-K=codec:${base%|*}|bf16@$rot" --contexts 2048 --windows 2 --attention-samples 0 \
  --tier-base "$base" --rank-tiers "8=$boost" --spec-out "$out/fidelity2/P2k.codec" \
  --json "$out/fidelity2/sensitivity-kl-2k.json" > "$out/fidelity2/sensitivity-kl-2k.txt"
python3 scripts/allocate_tiers.py "$out/fidelity2/sensitivity-kl-2k.json" > "$out/fidelity2/P2w.tiers"
"$kv" eval --layer-sensitivity --rank-by next-token-kl \
  --sensitivity-from "$out/fidelity2/sensitivity-kl-2k.json" --tier-base "$base" \
  --rank-tiers "$(tail -1 "$out/fidelity2/P2w.tiers")" --spec-out "$out/fidelity2/P2w.codec" > /dev/null
echo "P2k=codec:$(cat "$out/fidelity2/P2k.codec")@$rot,P2w=codec:$(cat "$out/fidelity2/P2w.codec")@$rot" \
  > "$out/fidelity2/klrank.formats"
for set in calib klrank; do
  for c in 1024,2048:4,2:1k2k 4096:3:4k 8192:2:8k; do
    IFS=: read -r ctx w tag <<< "$c"
    "$kv" eval --rotations "$rot" --formats "$(cat "$out/fidelity2/$set.formats")" \
      --contexts "$ctx" --windows "$w" --json "$out/fidelity2/$set-$tag.json" \
      > "$out/fidelity2/$set-$tag.txt"
  done
done
python3 scripts/fidelity_ci.py "$out"/fidelity2/explore[1-4].json > "$out/fidelity2/explore.md"
python3 scripts/fidelity_ci.py --vs turbo3 --only turbo3,oscar,P2 "$out"/fidelity2/explore1.json "$out"/fidelity2/explore4.json \
  "$out"/fidelity2/confirm-[48]k.json > "$out/fidelity2/confirm.md"
python3 scripts/fidelity_ci.py --vs turbo3,P2 --only turbo3,P2,P2c,P2c-o,P2k,P2w \
  "$out"/fidelity2/explore1.json "$out"/fidelity2/explore4.json "$out"/fidelity2/confirm-[48]k.json \
  "$out"/fidelity2/calib-*.json "$out"/fidelity2/klrank-*.json > "$out/fidelity2/calib.md"

# Round 3 (issue 19, continued; docs/fidelity.md "Round 3"): the values' per-layer next-token KL
# on the calibration text, keys and values allocated together within 2.5 bits (P2v, written
# into a copy of the rotation file), the other options of the research note tried on the
# calibration text, and turbo3, P2w and P2v on more held-out windows.
cal=$cache/text/calibration
"$kv" eval --layer-sensitivity --rank-by next-token-kl --rotations "$rot" \
  --formats "P2-V=codec:bf16|${base#*|}@$rot" --contexts 2048 --windows 2 --attention-samples 0 \
  --json "$out/fidelity2/sensitivity-v-kl-2k.json" > "$out/fidelity2/sensitivity-v-kl-2k.txt"
keys="4x64:eig:s8:pr;4x32+3x32:eig:s8:pr;4x16+3x32+2x16:eig:s8:pr;3x32+2x32:eig:s8:pr"
keys="$keys;3x32+2x16+1x16:eig:s8:pr;3x16+2x32+1x16:eig:s8:pr"
values="4x16+3x16+2x32:eig:s8:pr;3x32+2x32:eig:s8:pr;3x16+2x32+1x16:eig:s8:pr;2x32+1x32:eig:s8:pr"
# allocate NAME KEY_LADDER VALUE_LADDER [KEY_SENSITIVITIES VALUE_SENSITIVITIES]: keys and values
# allocated together within 2.5 bits from the next-token-KL sensitivities (default: the first
# two calibration windows), written to fidelity2/NAME.codec and into a copy of the rotation file.
allocate() {
  "$kv" eval --layer-sensitivity --rank-by next-token-kl --rotations "$rot" \
    --sensitivity-from "${4:-$out/fidelity2/sensitivity-kl-2k.json}" \
    --value-sensitivity-from "${5:-$out/fidelity2/sensitivity-v-kl-2k.json}" \
    --tier-base "$base" --allocate-bits 2.5 --key-ladder "$2" --value-ladder "$3" \
    --spec-out "$out/fidelity2/$1.codec" \
    --rotations-out "$r/SmolLM2-135M-Instruct.$1.safetensors" > "$out/fidelity2/$1.txt"
}
# held_out NAME TAG: the codec NAME's rotation file carries, on the held-out windows of every
# round-3 figure (8 x 1K, 4 x 2K, 6 x 4K, 2 x 8K), into fidelity2/round3TAG.
held_out() {
  "$kv" eval --rotations "$rot" --formats "$1=codec:@$r/SmolLM2-135M-Instruct.$1.safetensors" \
    --contexts 1024,2048,4096,8192 --windows 8,4,6,2 --json "$out/fidelity2/round3$2.json" \
    > "$out/fidelity2/round3$2.txt"
}
allocate P2v "$keys" "$values"
# The options on the calibration text: 2 windows of 2K (the sensitivities' own windows), and
# the survivors on 2 windows of 4K. Each .formats file is the --formats list of its run.
for s in jb opts1 P2v opts2 opts3; do
  "$kv" eval --text-dir "$cal" --rotations "$rot" --formats "$(cat docs/fidelity2/r3cal-$s.formats)" \
    --contexts 2048 --windows 2 --attention-samples 0 --json "$out/fidelity2/r3cal-$s-2k.json" \
    > "$out/fidelity2/r3cal-$s-2k.txt"
done
"$kv" eval --text-dir "$cal" --rotations "$rot" --formats "$(cat docs/fidelity2/r3cal-4k.formats)" \
  --contexts 4096 --windows 2 --attention-samples 0 --json "$out/fidelity2/r3cal-4k.json" \
  > "$out/fidelity2/r3cal-4k.txt"
python3 scripts/fidelity_ci.py --vs P2w,turbo3 "$out"/fidelity2/r3cal-*-2k.json \
  "$out/fidelity2/r3cal-4k.json" > "$out/fidelity2/r3cal.md"
# Held out: the first windows of each context are the ones of every earlier round-2 figure.
# P2v comes from the rotation file that carries it (label=codec:@FILE).
formats="turbo3,P2w=codec:$(cat "$out/fidelity2/P2w.codec")@$rot"
formats="$formats,P2v=codec:@$r/SmolLM2-135M-Instruct.P2v.safetensors"
for c in 1024,2048:8,4:1k2k 4096:6:4k 8192:2:8k; do
  IFS=: read -r ctx w tag <<< "$c"
  "$kv" eval --rotations "$rot" --formats "$formats" --contexts "$ctx" --windows "$w" \
    --json "$out/fidelity2/round3-$tag.json" > "$out/fidelity2/round3-$tag.txt"
done
# The control P2vf: the values floored at the base recipe (the value ladder without its last,
# 2x32+1x32), so the bits come from keys instead.
allocate P2vf "$keys" "${values%;*}"
held_out P2vf c
# P2vk: no key recipe below 2.63 b (the first four of the key ladder).
allocate P2vk "$(cut -d';' -f1-4 <<< "$keys")" "$values"
held_out P2vk d
# P2v's sensitivities saw two calibration documents. Both sides measured again on the next
# two windows (two more documents), averaged with the first two, allocated as P2v: P2v4.
for side in "K=codec:${base%|*}|bf16" "V=codec:bf16|${base#*|}"; do
  tag=$([[ $side == K=* ]] && echo kl || echo v-kl)
  "$kv" eval --layer-sensitivity --rank-by next-token-kl --rotations "$rot" \
    --formats "P2-$side@$rot" --contexts 2048 --windows 2 --first-window 2 \
    --attention-samples 0 --json "$out/fidelity2/sensitivity-$tag-2k-w34.json" \
    > "$out/fidelity2/sensitivity-$tag-2k-w34.txt"
done
allocate P2v4 "$keys" "$values" \
  "$out/fidelity2/sensitivity-kl-2k.json,$out/fidelity2/sensitivity-kl-2k-w34.json" \
  "$out/fidelity2/sensitivity-v-kl-2k.json,$out/fidelity2/sensitivity-v-kl-2k-w34.json"
held_out P2v4 b
# P2v4 is the codec the default model serves with --kv_format codec: its rotation file is kept
# in the repository's rotations/ (docs/rotation-file.md).
cp "$r/SmolLM2-135M-Instruct.P2v4.safetensors" rotations/
# Round 4: P2v4 as served (--kv_format codec: packed pages, its basis folded into the
# rotations) on the same held-out windows, paired with the evaluation codec and turbo3.
"$kv" eval --rotations "$rot" \
  --formats "P2v4-pages=codec-pages:rotations/SmolLM2-135M-Instruct.P2v4.safetensors" \
  --contexts 1024,2048,4096,8192 --windows 8,4,6,2 --json "$out/fidelity2/round4.json" \
  > "$out/fidelity2/round4.txt"
# Round 5: P2v4 with uniform levels (u after every pr), paired with turbo3 and P2v4.
spec=$(python3 - rotations/SmolLM2-135M-Instruct.P2v4.safetensors <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print(header["__metadata__"]["history_codec"].replace(":pr", ":pr:u"))
PY
)
"$kv" eval --rotations "$rot" \
  --formats "turbo3,P2v4=codec:@rotations/SmolLM2-135M-Instruct.P2v4.safetensors,P2v4u=codec:$spec@$rot" \
  --contexts 1024,2048,4096,8192 --windows 8,4,6,2 --json "$out/fidelity2/round5u.json" \
  > "$out/fidelity2/round5u.txt"
python3 scripts/fidelity_ci.py --vs turbo3,P2v4 "$out/fidelity2/round5u.json" > "$out/fidelity2/round5u.md"
# Round 6: a codec allocated under uniform levels (the sensitivities measured with them), served
# as codec fragment blocks; its rotation file is kept in rotations/ beside P2v4's.
"$kv" calibrate-codec --uniform-levels --out rotations/SmolLM2-135M-Instruct.P2v4u.safetensors \
  2>&1 | tee "$out/fidelity2/calibrate-codec-uniform.log"
"$kv" eval --rotations "$rot" \
  --formats "P2u=codec-pages:rotations/SmolLM2-135M-Instruct.P2v4u.safetensors" \
  --contexts 1024,2048,4096,8192 --windows 8,4,6,2 --json "$out/fidelity2/round6.json" \
  > "$out/fidelity2/round6.txt"
python3 scripts/fidelity_ci.py --vs turbo3,P2v4u,P2v4 "$out/fidelity2/round5u.json" \
  "$out/fidelity2/round6.json" > "$out/fidelity2/round6.md"
python3 scripts/fidelity_ci.py --vs turbo3,P2v4 --only turbo3,P2v4,P2v4-pages \
  "$out"/fidelity2/round3-*.json "$out/fidelity2/round3b.json" "$out/fidelity2/round4.json" \
  > "$out/fidelity2/round4.md"
python3 scripts/fidelity_ci.py --vs turbo3,P2w "$out"/fidelity2/round3-*.json \
  "$out"/fidelity2/round3[bcd].json > "$out/fidelity2/round3.md"
scripts/plot-fidelity.sh --vs turbo3 --only P2w,P2v,P2vk,P2v4 "$out/fidelity2/ratio.png" \
  "$out"/fidelity2/round3-*.json "$out"/fidelity2/round3[bd].json

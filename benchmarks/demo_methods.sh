#!/usr/bin/env bash
# The head types on the demo target, as a new user gets them: heads trained by the
# shipped demo configs (each leaves training with the tree it chose: no calibrate step), then one
# interleaved `draftheads bench` run per prompt set and temperature, every method beside plain
# `generate` on the same prompts.
#
#   bash benchmarks/demo_methods.sh [WORKDIR] [TARGET]
#
# WORKDIR (default /tmp/draftheads-demo-methods) gets runs/<type>/ and bench-<set>-t<temp>/;
# TARGET (default: demo) is passed as target.name_or_path / --target, e.g. a candidate demo
# shape's cache folder. Steps already done (heads/config.json present, report.json present) are
# skipped, so a killed run continues. THREADS (default 2) torch threads for the bench runs.
set -euo pipefail
W=${1:-/tmp/draftheads-demo-methods}
TARGET=${2:-demo}
PY=${PYTHON:-python}
THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W/runs"

for type in medusa hydra eagle eagle3 dflash peagle; do
  config=configs/demo-$type.yaml
  [ "$type" = medusa ] && config=configs/demo.yaml
  out=$W/runs/$type
  if [ ! -f "$out/heads/config.json" ]; then
    start=$(date +%s)
    $PY "$HERE/../train.py" --config "$HERE/../$config" target.name_or_path="$TARGET" \
      train.output_dir="$out" --overwrite
    echo "$type: trained in $(( $(date +%s) - start )) s" | tee -a "$W/train-times.txt"
  fi
done

heads=()
for type in medusa hydra eagle eagle3 dflash peagle; do heads+=(--heads "$W/runs/$type/heads"); done

for set in default midfile; do
  questions=()
  [ "$set" = midfile ] && questions=(--questions "$HERE/measurements/head-types-demo/midfile-prompts.jsonl" --no-chat-template)
  for temp in 0 0.7; do
    out=$W/bench-$set-t$temp
    [ -f "$out/report.json" ] && continue
    $PY -m draftheads.cli bench --target "$TARGET" "${heads[@]}" "${questions[@]}" --temperature "$temp" \
      --max-new-tokens 128 --warmup 1 --threads "$THREADS" --seed 0 --out "$out" --overwrite --no-progress
  done
done

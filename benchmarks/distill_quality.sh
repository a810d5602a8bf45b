#!/usr/bin/env bash
# Quality of self-distilled data on the demo target: Medusa heads trained for the same steps on
# (a) 400 original 256-token windows of the demo corpus and (b) the same windows' first 64 tokens
# continued by the target (draftheads distill, greedy, 192 new tokens); then mean accepted tokens
# per target forward in `draftheads bench` on the demo's held-out prompts, greedy.
#   bash benchmarks/distill_quality.sh [WORKDIR]
set -euo pipefail
W=${1:-/tmp/draftheads-distill-quality}
PY=${PYTHON:-python}
mkdir -p "$W"
$PY - "$W" <<'PYEOF'
import json, random, sys
from transformers import AutoTokenizer
from draftheads.demo import corpus_texts, resolve_target
w = sys.argv[1]
tok = AutoTokenizer.from_pretrained(resolve_target("demo"))
chunks = []
for text in corpus_texts("train"):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    chunks += [ids[i : i + 256] for i in range(0, len(ids) - 256, 256)]
rows = random.Random(0).sample(chunks, 400)
with open(f"{w}/orig.jsonl", "w") as f:
    for ids in rows:
        f.write(json.dumps({"text": tok.decode(ids)}) + "\n")
PYEOF
[ -f "$W/regen.jsonl.distill.json" ] && grep -q '"complete": true' "$W/regen.jsonl.distill.json" || \
  $PY -m draftheads.cli distill --target demo --data "$W/orig.jsonl" --out "$W/regen.jsonl" --max-new-tokens 192 \
    --prompt-tokens 64 --batch-size 32 --dtype float32 --resume --no-progress
for name in orig regen; do
  [ -f "$W/run-$name/heads/config.json" ] || $PY train.py --config configs/demo.yaml data.path="$W/$name.jsonl" \
    data.eval_split=null data.eval_fraction=0.05 data.max_samples=null train.max_steps=100 train.warmup_steps=10 \
    train.eval_every=0 train.save_every=0 train.output_dir="$W/run-$name"
  $PY -m draftheads.cli bench --target demo --heads "$W/run-$name/heads" --max-new-tokens 64 --max-questions 12 \
    --out "$W/bench-$name" --overwrite --no-progress --threads 1
done
$PY - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
for name in ("orig", "regen"):
    r = json.load(open(f"{w}/bench-{name}/report.json"))
    print(name, json.dumps(r.get("summary", r), default=str)[:1500])
PYEOF

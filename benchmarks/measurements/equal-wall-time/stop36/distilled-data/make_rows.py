"""Corpus chunks for distillation: the demo's training files (seeded shuffle, 200 files, as data.max_samples=200
with data.seed=0 reads them... approximately), cut into 320-token chunks."""
import json, random, sys
from draftheads.demo import corpus_texts
from draftheads.target import load_target
_, tok = load_target("demo")
texts = list(corpus_texts("train"))
random.Random(0).shuffle(texts)
texts = texts[:200]
rows = []
for t in texts:
    ids = tok(t).input_ids
    for s in range(0, len(ids) - 160, 320):
        rows.append({"text": tok.decode(ids[s:s + 320])})
random.Random(1).shuffle(rows)
half = len(rows) // 2
for name, part in (("a", rows[:half]), ("b", rows[half:])):
    with open(f"/work/measure/s35/chunks-{name}.jsonl", "w") as f:
        for r in part:
            f.write(json.dumps(r) + "\n")
print(len(rows), "rows", sum(len(tok(r["text"]).input_ids) for r in rows[:50]) / 50, "tokens each")

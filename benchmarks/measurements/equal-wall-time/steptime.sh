#!/usr/bin/env bash
# Seconds per training step of the shipped EAGLE and EAGLE-3 demo recipes, interleaved, 1 thread each.
cd /work/main; . .venv/bin/activate
export DRAFTHEADS_NUM_THREADS=1 OMP_NUM_THREADS=1
for round in 1 2; do
  for cfg in eagle eagle3; do
    out=/work/walltime/st-$cfg-$round
    python - "$cfg" "$out" <<'PY' > $out.log 2>&1
import sys
from draftheads.train import trainer
trainer.Trainer.choose_tree = lambda self, *a, **k: None   # step time only: no plan choice
import train
sys.exit(train.main(["--config", f"configs/demo-{sys.argv[1]}.yaml", f"train.output_dir={sys.argv[2]}",
                     "train.max_steps=40", "train.eval_every=1000", "train.save_every=1000", "--overwrite"]))
PY
    python3 -c "import json;d=json.load(open('$out/metrics.json'));print('$cfg', $round, round(d['stage_seconds']['train']/40,3), 's/step', open('/proc/loadavg').read().split()[0])"
  done
done

"""Runs `draftheads distill`'s vLLM engine inside a separate vLLM virtual environment (used by
test_distill.py). That venv has no `datasets`, so the two modules distill needs are imported
without the package __init__ files.

    python vllm_distill_worker.py REPO_ROOT MODEL_DIR DATA.jsonl OUT.jsonl MAX_NEW_TOKENS BATCH_SIZE [EVAL_OVERLAP]
"""
import json
import sys
import types

root, model, data, out, max_new, batch = sys.argv[1:7]
eval_overlap = sys.argv[7] if len(sys.argv) > 7 else "refuse"
for name, sub in (("draftheads", ""), ("draftheads.data", "/data")):
    mod = types.ModuleType(name)
    mod.__path__ = [f"{root}/draftheads{sub}"]
    sys.modules[name] = mod

from transformers import AutoTokenizer  # noqa: E402

from draftheads.data.distill import DistillSettings, VLLMEngine, distill  # noqa: E402

settings = DistillSettings(target=model, data=data, out=out, engine="vllm", max_new_tokens=int(max_new), batch_size=int(batch),
                           eval_overlap=eval_overlap)
tokenizer = AutoTokenizer.from_pretrained(model)
stats = distill(settings, VLLMEngine(model, tokenizer, settings, dtype="float32"), tokenizer, progress=False)
print("STATS", json.dumps(stats.__dict__))

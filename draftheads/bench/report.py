"""report.json (everything, machine-readable) and report.md (the tables a person reads)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomically
from .methods import PLAIN
from .metrics import OVERALL

REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _spread(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['min']:.2f} / {s['q1']:.2f} / {s['q3']:.2f} / {s['max']:.2f}"


def _exact(g: dict[str, Any]) -> str:
    return "-" if g.get("exact_of") is None else f"{g['exact']}/{g['exact_of']}"


def markdown(report: dict[str, Any]) -> str:
    """report.md: the run's setting, then one section per table; a section with nothing to show
    (one round, one category, a report from before decode timing) is left out."""
    sections = (_setting, _overall, _decoding_alone, _per_question, _by_category, _methods, _exactness, _plots)
    lines = [line for section in sections for line in section(report)]
    lines.append("")
    return "\n".join(lines)


def _names(report: dict[str, Any]) -> list[str]:
    """The methods compared with plain, in the report's order."""
    return [m["name"] for m in report["methods"]]


def _setting(report: dict[str, Any]) -> list[str]:
    """The title, then the target, the machine, the questions and how every method was timed."""
    env, settings, q = report["environment"], report["settings"], report["questions"]
    truncated = f", {q['truncated']} prompts cut to fit the context" if q["truncated"] else ""
    rounds = _rounds(report)
    template = f"chat template {'on' if settings['use_chat_template'] else 'off'}"
    return [
        "# draftheads bench",
        "",
        f"Target `{env['target']}` ({env['target_parameters'] / 1e6:.1f} M parameters), {env['dtype']} on "
        f"{env['gpu'] or env['cpu']} ({env['device']}, {env['torch_threads']} torch threads); torch {env['torch']}, "
        f"transformers {env['transformers']}, draftheads {env['draftheads']}.",
        f"Questions: {q['source']}: {q['questions']} questions, {q['samples']} turns"
        f"{truncated}; categories "
        f"{', '.join(q['categories'])}. Up to {settings['max_new_tokens']} new tokens, temperature "
        f"{settings['temperature']}, seed {settings['seed']}, {settings['warmup']} untimed warm-up run(s) per method, "
        f"{template}. Plain `generate` and every method ran "
        f"interleaved on each prompt, {rounds} timed round{'s' if rounds != 1 else ''} per prompt"
        + (" (a prompt's speedup: total tokens / total seconds over its rounds, against plain's)." if rounds > 1 else "."),
    ]


def _rounds(report: dict[str, Any]) -> int:
    return report["settings"].get("rounds", 1)  # reports written before --rounds have none: one round


def _overall(report: dict[str, Any]) -> list[str]:
    """Plain and every method over all samples."""
    lines = ["", "## Overall", "",
             "| method | mean accepted tokens | tokens/s | speedup | per-sample speedup, median | spread (min / q1 / q3 / max) | exact |",
             "|---|---|---|---|---|---|---|"]
    for name in [PLAIN, *_names(report)]:
        g = report["results"][name]["by_category"][OVERALL]
        lines.append(
            f"| {name} | {_fmt(g['mean_accepted_tokens'])} | {_fmt(g['tokens_per_second'], '.1f')} | "
            f"{_fmt(g['speedup'], '.2f', 'x')} | {_fmt((g['per_sample_speedup'] or {}).get('median'), '.2f', 'x')} | "
            f"{_spread(g['per_sample_speedup'])} | {_exact(g)} |"
        )
    return lines


def _decoding_alone(report: dict[str, Any]) -> list[str]:
    """The speedup of decoding itself (prefill and first token excluded); reports from before it have none."""
    decoding = [(name, report["results"][name]["by_category"][OVERALL]) for name in _names(report)]
    if not any(g.get("decode_speedup") is not None for _, g in decoding):
        return []
    lines = ["", "## Decoding alone (prefill and the first token excluded)", "",
             "Same samples, the tokens after the first over the seconds after the prefill (the forward that "
             "gives the first token): the speed of decoding itself, which at temperature > 0 is what compares "
             "methods whose sampled answers differ in length.", "",
             "| method | decode-only speedup | per-sample, median | spread (min / q1 / q3 / max) |",
             "|---|---|---|---|"]
    for name, g in decoding:
        lines.append(f"| {name} | {_fmt(g.get('decode_speedup'), '.2f', 'x')} | "
                     f"{_fmt((g.get('per_sample_decode_speedup') or {}).get('median'), '.2f', 'x')} | "
                     f"{_spread(g.get('per_sample_decode_speedup'))} |")
    return lines


def _per_question(report: dict[str, Any]) -> list[str]:
    """With several rounds: each question's speedup over its rounds, and how far rounds spread."""
    rounds, results = _rounds(report), report["results"]
    if rounds <= 1:
        return []
    lines = ["", f"## Per question, over {rounds} rounds", "",
             "| method | per-question speedup, median | min-max over questions | widest min-max over rounds |",
             "|---|---|---|---|"]
    for name in _names(report):
        g = results[name]["by_category"][OVERALL].get("per_question_speedup")
        per_q = [x for x in results[name].get("per_question", []) if x["round_min"] is not None]
        widest = max(per_q, key=lambda x: x["round_max"] - x["round_min"], default=None)
        lines.append(
            f"| {name} | {_fmt((g or {}).get('median'), '.2f', 'x')} | "
            + ("-" if not g else f"{g['min']:.2f}-{g['max']:.2f}x") + " | "
            + ("-" if widest is None else
               f"{widest['round_min']:.2f}-{widest['round_max']:.2f}x ({widest['question_id']}, turn {widest['turn']})")
            + " |"
        )
    return lines


def _by_category(report: dict[str, Any]) -> list[str]:
    """With several categories: each method's speedup and accepted tokens per category."""
    cats, methods = report["questions"]["categories"], _names(report)
    if len(cats) <= 1:
        return []
    lines = ["", "## By category: speedup (mean accepted tokens)", "",
             "| category | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for c in cats:
        cells = []
        for name in methods:
            g = report["results"][name]["by_category"].get(c)
            cells.append("-" if g is None else f"{_fmt(g['speedup'], '.2f', 'x')} ({_fmt(g['mean_accepted_tokens'])})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _methods(report: dict[str, Any]) -> list[str]:
    """What each method ran with, its tree included."""
    lines = ["", "## Methods", ""]
    for m in report["methods"]:
        details = ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("name", "tree") and v is not None)
        lines.append(f"- **{m['name']}**: {details}")
        if "tree" in m:
            lines.append(f"  tree ({m['tree_nodes']} nodes): `{json.dumps(m['tree'])}`")
    return lines


def _exactness(report: dict[str, Any]) -> list[str]:
    exact = report["all_exact"]
    return ["", "Exactness: " + ("not checked (temperature > 0: sampled outputs differ draw by draw)" if exact is None
                                 else "every output equals plain greedy `generate`" if exact
                                 else "**some outputs differ from plain greedy `generate`** (see report.json samples)")]


def _plots(report: dict[str, Any]) -> list[str]:
    if report.get("plots"):
        return ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    if report.get("plots_missing"):
        return ["", f"Plots not written: {report['plots_missing']}"]
    return []


def write_report(out: Path, report: dict[str, Any]) -> None:
    write_text_atomically(out / REPORT_JSON, json.dumps(report, indent=2) + "\n")
    write_text_atomically(out / REPORT_MD, markdown(report))

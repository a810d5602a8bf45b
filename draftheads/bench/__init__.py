"""`draftheads bench`: speed, accepted tokens and exactness of every method against plain
`generate`, measured interleaved on the same prompts, with Spec-Bench's definitions.

    questions.py   what to ask (MT-Bench, Spec-Bench, chat prompts by name; Spec-Bench jsonl, text files)
    methods.py     name -> decoder (heads of any type, draft model, prompt lookup)
    runner.py      plain generate and every method, interleaved, timed, exactness checked
    metrics.py     mean accepted tokens, tokens/s, speedup, spreads, by category
    report.py      report.json and report.md;  plots.py: PNG plots;  environment.py: versions
    command.py     the command line
"""
from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .methods import Method, build_methods, resolve_compare
    from .metrics import summarize
    from .questions import Question, load_questions, select
    from .runner import Runner, Sample, Settings

# loaded on first use: `draftheads bench --help` needs no torch
__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("Method", "build_methods", "resolve_compare"), ".methods"),
    "summarize": ".metrics",
    **dict.fromkeys(("Question", "load_questions", "select"), ".questions"),
    **dict.fromkeys(("Runner", "Sample", "Settings"), ".runner"),
})

__all__ = [
    "Method", "Question", "Runner", "Sample", "Settings", "build_methods", "load_questions",
    "resolve_compare", "select", "summarize",
]

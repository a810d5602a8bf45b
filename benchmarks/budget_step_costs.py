"""What the draft budget sees of a heads drafter's steps: their seconds and accepted drafts, split by
how many plain steps came just before, with the online budget and with none.

    python benchmarks/budget_step_costs.py --heads runs/smollm2/heads [--questions mt-bench] [--num-prompts 8]

Why: behind prompt lookup, a budget of the heads' own judged their chain of one plain on 82-97% of
the heads' steps although drafting it always ran no slower (results page, hybrid-budget runs). A
heads drafter skips its draft layer on plain steps and catches up on every pending position at its
next drafting step, so a probe after a run of plain steps may cost more than a drafting step in a
run of them, and the budget files that cost under the probe's depth. This prints, per budget,
the steps by depth and by the plain steps before them (0, 1-3, 4+): their median and least seconds
and their accepted drafts, and the budget's last ``reach`` (its estimate of P(a depth-1 draft is
accepted)). Heads alone, greedy, the plan's tree, the first turn of each question; no
``generate`` runs, so no speedup is printed: `draftheads bench` measures that.
"""
from __future__ import annotations

import argparse
import statistics

import torch
from prompts import add_arguments, load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, num=8)
    ap.add_argument("--heads", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.inference.draft_budget import DraftBudget, OnlineDraftBudget
    from draftheads.target import load_target

    target, tokenizer = load_target(args.target)
    heads = dh.load_heads(args.heads, target=target)
    prompts = load_prompts(tokenizer, args.questions, args.num_prompts)

    def logged(base: type) -> DraftBudget:
        class Logged(base):
            """``base``, logging every step as (drafted depth, plain steps just before, seconds, accepted)."""

            def __init__(self) -> None:
                super().__init__()
                self.log: list[tuple[int, int, float, int]] = []
                self.gap = 0

            def start(self) -> None:
                super().start()
                self.gap = 0

            def record(self, drafted, accepted, seconds) -> None:
                self.log.append((drafted, self.gap, seconds, accepted[0] if accepted else 0))
                self.gap = 0 if drafted > 0 else self.gap + 1
                super().record(drafted, accepted, seconds)

        return Logged()

    for name, base in (("online budget", OnlineDraftBudget), ("no budget", DraftBudget)):
        budget = logged(base)
        decoder = dh.SpeculativeDecoder(target, heads, prompt_lookup=False, draft_budget=budget)
        with torch.inference_mode():
            for ids in prompts:
                decoder.generate(ids, max_new_tokens=args.max_new_tokens)
        print(f"\n{name}: steps {budget.stats()['draft_budget']['steps']}, reach {getattr(budget, 'reach', None)}")
        print("| depth | plain steps before | steps | median ms | least ms | accepted drafts |")
        print("|---|---|---|---|---|---|")
        for depth in sorted({d for d, *_ in budget.log}):
            for label, lo, hi in (("0", 0, 0), ("1-3", 1, 3), ("4+", 4, 10**9)):
                rows = [(s, a) for d, g, s, a in budget.log if d == depth and lo <= g <= hi]
                if rows:
                    seconds = [s for s, _ in rows]
                    print(f"| {depth} | {label} | {len(rows)} | {1e3 * statistics.median(seconds):.1f} "
                          f"| {1e3 * min(seconds):.1f} | {sum(a for _, a in rows) / len(rows):.3f} |")


if __name__ == "__main__":
    main()

"""The suite's recorded answers replayed offline: what prompt lookup (chain and tree), the suffix drafter and
`auto` draft on each turn, round by round, against the target's recorded greedy answers.

    python -m benchmarks.agentic_replay RESULTS.jsonl [--profile NAME|FILE.json] [--modes ngram,suffix,auto]
                                        [--show CATEGORY:MODE[:TURN] ...]

RESULTS.jsonl is a suite's output with `off` rows (`speczoo suite MODEL --questions agentic --methods off
...`, or `--questions builtin`: the agentic traces and the built-in questions are both known here): their
ids are the target's greedy answers, turn by turn, and the prompts are rebuilt from the questions and
those answers as the suite builds them. With greedy verification a speculative run is fixed by
them, so each mode is replayed through the engine's own rounds (decoding/round.py `run_round`, the real
controller and drafters, `verify_recorded`), with a suffix memory of its own that remembers its answers in the
suite's order, as the suite's tenant per method does. The controller decides with fixed costs (a built-in
profile of benchmarks/replay_profiles.py, or a measured one), never the machine's timings: the figures
(accepted per round, rounds, modeled tokens per target step) do not depend on load. The auto mode offers
what `auto` offers a target with no draft model: prompt lookup's chain and tree, and the suffix drafter
(a tree round costs c_v of its nodes + 1 rows; the controller prices it by its own trees, as the engine's).
`--show` prints each round of a category's mode (or one turn of it): the context's tail, the draft, what the
target wrote. A measurement script, never imported by the runtime; it never runs a model.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.drafters.suffix import SuffixDrafter
from speczoo.decoding.drafters.suffix_memory import SuffixMemory
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.policy import make_policy
from speczoo.decoding.round import Generation, RoundPlan, run_round, verify_recorded
from speczoo.request import GenerationRequest

from benchmarks.replay_profiles import Profile, load_profile

MODES = ("ngram", "ngram-tree", "suffix", "auto")


@dataclass
class Tally:
    """One mode over some turns: rounds, draft tokens proposed and accepted, tokens emitted, target steps, and
    the rounds that verified a branching tree."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    cost: float = 0.0
    lossless: bool = True
    trees: int = 0

    def add(self, other: Tally) -> None:
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.tokens += other.tokens
        self.cost += other.cost
        self.lossless &= other.lossless
        self.trees += other.trees

    @property
    def per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def speedup(self) -> float:
        """Tokens per target step, against plain decoding's 1.0."""
        return self.tokens / self.cost if self.cost else 0.0


def drafters_for(mode: str, prompt: list[int], memory: SuffixMemory, order: int, auto_trees: bool = True
                 ) -> dict[str, Drafter]:
    """The drafters `mode` offers on one turn (auto: prompt lookup's chain and tree, and the suffix drafter;
    without `auto_trees`, the chains only: what `auto` offered before it priced trees)."""
    out: dict[str, Drafter] = {}
    if mode in ("ngram", "auto"):
        out["ngram"] = NgramDrafter(max_order=order)
    if mode == "ngram-tree" or (mode == "auto" and auto_trees):
        out["ngram-tree"] = NgramTreeDrafter(max_order=order)
    if mode in ("suffix", "auto"):
        out["suffix"] = SuffixDrafter(memory.open(mode), len(prompt), max_order=order)
    return out


def replay_turn(prompt: list[int], out: list[int], drafters: dict[str, Drafter], profile: Profile, k: int,
                show=None) -> Tally:
    """One turn's rounds under the controller at `profile`'s costs; `show(context, plan, accepted, truth)`
    sees each round."""
    costs = Costs(cv=CvCurve.measured(profile.target_cv), draft_cost={n: 0.0 for n in drafters},
                  round_overhead=profile.round_overhead)
    ctl = make_policy(GenerationRequest(prompt_ids=prompt, k=k), drafters, costs)   # as the engine configures it
    t = Tally(tokens=len(out))

    def verify(g: Generation, plan: RoundPlan):
        at = len(g.out)
        verdict, judged = verify_recorded(plan, out, at)
        t.trees += not plan.chain
        if show is not None:
            show(g.context + [g.pending], plan, verdict.accepted, out[at + 1:at + 3 + verdict.accepted])
        return verdict, judged

    g = Generation(drafters, ctl, list(prompt), len(out))
    g.start(out[0])
    while g.finish is None:
        r = run_round(g, verify)
        t.cost += costs.cv(r.drafted + 1) + costs.round_overhead if r.drafted else 1.0
    g.end()
    t.rounds, t.drafted, t.accepted, t.lossless = g.stats.rounds, g.stats.drafted, g.stats.accepted, g.out == out
    return t


def replay_suite(rows: list[dict], questions: dict, tokenizer, modes: Sequence[str], profile: Profile,
                 k: int = 8, order: int = 3, show: frozenset[str] = frozenset(), turns_out=None,
                 auto_trees: bool = True) -> dict[tuple[str, str], Tally]:
    """(category, mode) -> its Tally over the `off` rows' answers, questions in the rows' order; `turns_out`
    (if given) gets (category, mode, turn, Tally) per turn; auto_trees as for `drafters_for`."""
    from speczoo.bench.suite import turn_ids

    memories = {m: SuffixMemory() for m in modes}
    totals: dict[tuple[str, str], Tally] = {}
    for row in (r for r in rows if r["method"] == "off"):
        q = questions[row["question_id"]]
        for turn, answer in enumerate(row["ids"]):
            prompt = turn_ids(tokenizer, q, row["texts"][:turn])
            for mode in modes:
                wanted = {f"{q.category}:{mode}", f"{q.category}:{mode}:{turn}"} & show
                printer = _printer(tokenizer) if wanted else None
                if printer:
                    print(f"== {q.category} turn {turn} {mode}")
                t = replay_turn(prompt, answer, drafters_for(mode, prompt, memories[mode], order, auto_trees), profile, k,
                                printer)
                totals.setdefault((q.category, mode), Tally()).add(t)
                if turns_out is not None:
                    turns_out(q.category, mode, turn, t)
    return totals


def known_questions() -> dict:
    """question_id -> Question of the suite's built-in questions and its agentic traces (their ids apart)."""
    from speczoo.bench.agentic import agentic_questions
    from speczoo.bench.questions import builtin_questions

    builtin, agentic = builtin_questions(), agentic_questions()
    clash = {q.question_id for q in builtin} & {q.question_id for q in agentic}
    if clash:
        raise ValueError(f"question ids {sorted(clash)} are both built-in questions and agentic traces")
    return {q.question_id: q for q in builtin + agentic}


def _printer(tokenizer):
    def show(context: list[int], plan: RoundPlan, accepted: int, truth: list[int]) -> None:
        d = plan.draft.tokens
        print(f"  {plan.drafter:10} K={len(d)} acc {accepted}: ..{tokenizer.decode(context[-6:])!r} | "
              f"draft {tokenizer.decode(d)!r} | truth {tokenizer.decode(truth)!r}")
    return show


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a suite's results.jsonl with `off` rows of the agentic traces")
    ap.add_argument("--profile", default=None, help="costs: a built-in profile (replay_profiles.py) or a cost "
                    "profile file (default: the target bundle's, as loaded)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--k", type=int, default=8, help="max draft tokens per round (the suite's --k)")
    ap.add_argument("--show", action="append", default=[], metavar="CATEGORY:MODE[:TURN]")
    ap.add_argument("--turns", action="store_true", help="also print each turn's figures")
    ap.add_argument("--no-trees", action="store_true", help="auto offers the chains only (as before it priced trees)")
    args = ap.parse_args(argv)
    from speczoo.runtime import load

    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    off = [r for r in rows if r["method"] == "off"]
    if not off:
        raise SystemExit(f"{args.results} has no 'off' rows: run the suite with the off method first")
    rt = load(off[0]["target"])
    if args.profile is None:
        from speczoo.decoding.pricing.profile import load_or_measure
        from benchmarks.replay_profiles import measured_profile
        profile = measured_profile(load_or_measure(rt), name=f"{off[0]['target']} (its bundle's)")
    else:
        profile = load_profile(args.profile)
    print(profile.describe())
    questions = known_questions()
    modes = args.modes.split(",")

    def per_turn(cat: str, mode: str, turn: int, t: Tally) -> None:
        if args.turns:
            print(f"{cat:14} turn {turn} {mode:10} rounds {t.rounds:3d} drafted {t.drafted:3d} accepted "
                  f"{t.accepted:3d} ({t.per_round:.2f}/round) {t.speedup:.2f}x")

    totals = replay_suite(off, questions, rt.tokenizer, modes, profile, args.k, off[0].get("ngram", 3),
                          frozenset(args.show), per_turn, not args.no_trees)
    print(f"{'category':14} {'mode':10} {'rounds':>6} {'drafted':>7} {'accepted':>8} {'acc/round':>9} "
          f"{'tok/step':>8} {'trees':>5} lossless")
    overall: dict[str, Tally] = {}
    for (cat, mode), t in totals.items():
        overall.setdefault(mode, Tally()).add(t)
        print(f"{cat:14} {mode:10} {t.rounds:6d} {t.drafted:7d} {t.accepted:8d} {t.per_round:9.2f} "
              f"{t.speedup:7.2f}x {t.trees:5d} {t.lossless}")
    for mode, t in overall.items():
        print(f"{'all':14} {mode:10} {t.rounds:6d} {t.drafted:7d} {t.accepted:8d} {t.per_round:9.2f} "
              f"{t.speedup:7.2f}x {t.trees:5d} {t.lossless}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

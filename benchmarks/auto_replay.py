"""What each speculative mode's controller would do, round by round, replayed offline from one greedy run.

    python -m benchmarks.auto_replay [TARGET] [--prompts free_form,...] [--suite N] [--gen 256]
                                     [--record FILE | --replay FILE] [--draft-ratio R] [--head NAME]
                                     [--profile NAME|FILE.json ...] [--draft-profile FILE.json] [--each]
                                     [--charge-misses]

With greedy verification a speculative run is fixed by the target's greedy output, by what prompt lookup
finds in the committed text, and by what the draft model predicts, with what confidence, after each
prefix of it. One target run and one teacher-forced draft forward per prompt (draft_replay.py) record
all of it; the replay then drives the real controller (decoding/policy.py, decoding/controller.py) and the real
prompt-lookup drafter round by round, with the draft model stood in for by its recorded predictions and
its lag (the ids it has not fed) kept as the real drafter keeps it. Each round is charged what it would
cost, in target decode steps:
  * the draft model: its catch-up forward over lag + 1 ids at its OWN c_v curve (not the target's, which
    the controller assumes), then one forward per further step, each also over the ids prompt lookup
    guesses it will say (the real Guesser, decoding/drafters/guess.py; those it confirms need no step of
    their own; the controller still prices each token at a full draft step, as the engine's meter
    does, decoding/pricing/calibrate.py);
  * the verify: the target's c_v(K + 1) plus the round overhead; a plain round: 1.
With `--head NAME` an EAGLE head joins in: one teacher-forced target forward per recording gives the
features the engine would hand it, and the real EagleDrafter (chain and tree) drafts from them, round
by round, as in the engine; a round costs its head steps (a batched catch-up counts as one) and the
target's c_v over the chain or the flattened tree.
So `auto` can be compared with each single drafter on the same text, and a change to the controller
judged in seconds, without the timing noise of a live benchmark (`python -m benchmarks.drafters`
measures the real thing). The draft's confidences after its first wrong token are not observable
offline; the replay stops its chain there in every mode alike, which leaves a chain's drafting past a
miss uncharged. With `--charge-misses` the chain goes on there until its floors or K stop it, each
further token charged a draft step, its confidences on the right text standing in for the unrecorded
ones: the replay to judge how far a chain drafts by.

Cost profiles: the recordings carry the costs measured when they were made, but `auto` must hold on
every kernel path, whatever its costs. `--profile NAME` replays them under a built-in profile of one
path's shape (replay_profiles.py: cheap-verify, dear-verify, dear-draft), `--profile FILE.json` under a
measured one (a target's profile as decoding/pricing/profile.py saves it, `speczoo cv MODEL --json` or a
bundle's cost-<backend>.json; the draft's with `--draft-profile`). The controller is then handed exactly those
costs, as if the engine's meter had already learnt them. The report is per category of the suite (the
recordings' `{category}-{question_id}` names; a built-in prompt is a category of its own): each mode's
output tokens per modeled target step, against plain greedy's 1.0, and whether `auto` holds
AUTO_FLOOR × greedy in every category (replay_report.py). A measurement script, never imported by the runtime: it must
never run a model when replaying, and never change a recording's tokens, only the prices.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from speczoo.decoding.controller import NONE, Controller
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.draft_model import agreeing_prefix, catch_up_ids, reduced_head
from speczoo.decoding.drafters.guess import Guesser
from speczoo.decoding.drafters.registry import BUILTIN, EAGLE_HEAD
from speczoo.decoding.round import Generation, RoundPlan, run_round, verify_recorded
from speczoo.decoding.tuning import DRAFTING, PRICING
from speczoo.decoding.types import Draft
from speczoo.models.forward import Readout

from benchmarks.replay_profiles import PROFILES, load_profile
from benchmarks.replay_report import AUTO_FLOOR, print_report

MODES = ("ngram", "draft", "auto")
EAGLE_MODES = tuple(s.name for s in BUILTIN if s.takes_name == EAGLE_HEAD)
NOT_AUTO = frozenset(s.name for s in BUILTIN if not s.auto)      # as the runtime's `auto` (their descriptors)


@dataclass
class Recording:
    """One prompt's greedy run and the draft's teacher-forced view of it, with the costs measured then."""
    prompt: list[int]
    out: list[int]              # the target's greedy output
    guess: list[int]            # guess[j]: the draft's argmax for out[j] given prompt + out[:j]
    sure: list[float]           # its softmax probability
    target_cv: dict[int, float] = field(default_factory=dict)   # the target's c_v(S)
    draft_cv: dict[int, float] = field(default_factory=dict)    # the draft's own forward cost over S ids,
    #                                                             in draft steps (1 id = 1.0)
    draft_step: float = 0.3     # the draft's step in target steps
    round_overhead: float = PRICING.round_overhead


class RecordedDraft(Drafter):
    """The draft model as the recording saw it: proposes its recorded argmax chain (stopping on the
    controller's floors, or after its first wrong token), keeps `fed` as DraftModelDrafter does, sizes
    and judges its prompt-lookup guesses with the real Guesser (decoding/drafters/guess.py: a forward over
    the guessed ids as well; each the draft confirms saves a step), and reports each proposal's cost in
    target steps through `spent`. With `charge_misses` a chain goes on past its first wrong token as the
    real one would, until the floors or K stop it, each further token a one-row forward charged to it;
    what the draft would say and how sure it would be there was not recorded, so its tokens and
    confidences on the right text stand in (the tokens are judged wrong all the same: they follow a miss).
    window: a catch-up feeds at most this many missed ids, as DraftModelDrafter's (0: all); its predictions
    are still the recorded ones, fed every id: the replay prices the bounded catch-up, not what the ids it
    skips cost its acceptance (a live run measures that)."""

    name = "draft"
    stops_on_confidence = True

    def __init__(self, rec: Recording, guesses: bool = True, charge_misses: bool = False,
                 window: int = DRAFTING.catch_up_window):
        self.rec = rec
        self.window = window
        self.charge_misses = charge_misses
        self.fed: list[int] = []
        self.spent = 0.0
        self._cv = CvCurve.measured(rec.draft_cv) if rec.draft_cv else CvCurve.constant(1.0)
        self.guesser = Guesser(self._cv, DRAFTING.guess_max) if guesses else None

    def reset(self) -> None:
        self.fed = []
        if self.guesser is not None:
            self.guesser.reset()

    def lag(self, context: list[int]) -> int:
        return catch_up_ids(len(context) - 1 - agreeing_prefix(self.fed, context), self.window)

    def prefill(self, prompt: list[int]) -> None:
        self.fed = list(prompt[:-1])

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        r = self.rec
        # the catch-up's ids and the last context id
        feed = catch_up_ids(len(context) - 1 - agreeing_prefix(self.fed, context), self.window) + 1
        self.fed = list(context)
        j = len(context) - len(r.prompt)                         # the output index the first token predicts
        tokens: list[int] = []
        said: list[float] = []
        sure = 1.0
        end = missed = stopped = False
        while not end:
            g = self.guesser.guess(context, tokens, k - len(tokens) - 1) if self.guesser else []
            self.spent += r.draft_step * self._cv.wide(feed + len(g))          # one forward
            confirmed, censored = 0, False
            for m in range(1 + len(g)):
                i = len(tokens)
                if j + i >= len(r.out):                          # the recording ends here
                    end, censored = True, True
                    break
                t = r.guess[j + i]
                tokens.append(t)
                said.append(r.sure[j + i])
                if i < len(floors):
                    sure *= r.sure[j + i]
                missed = t != r.out[j + i]
                stopped = i + 1 == k or (i < len(floors) and sure < floors[i])
                end = missed or stopped
                agreed = m < len(g) and g[m] == t
                confirmed += agreed
                if end or not agreed:
                    censored = end and agreed
                    break
            if g:
                self.guesser.judge(len(g), confirmed, censored)
            feed = 1
        while missed and self.charge_misses and not stopped and j + len(tokens) < len(r.out):
            i = len(tokens)                                      # past the miss: one forward a token
            self.spent += r.draft_step
            tokens.append(r.guess[j + i])
            said.append(r.sure[j + i])
            if i < len(floors):
                sure *= r.sure[j + i]
            stopped = i + 1 == k or (i < len(floors) and sure < floors[i])
        self.fed.extend(tokens[:-1])
        return Draft(tokens=tokens, drafter=self.name, confidences=said if floors else None)

    def commit(self, accepted: int) -> None:
        pass

@dataclass
class EagleReplay:
    """An EAGLE head to replay on one recording: the head, its step in target steps, the tree shape of
    eagle-tree, and the target's features at the head's layers over prompt + output ([N, D] each)."""
    head: object                         # decoding.eagle.head.EagleHead
    step: float
    tree: object                         # decoding.drafters.eagle.TreeShape
    features: list


@dataclass
class Replay:
    speedup: float                       # output tokens per target step, against plain decoding's 1.0
    rounds: int
    by_drafter: dict[str, int]           # rounds per drafter ("none": plain)
    cost: float                          # target steps spent
    lossless: bool = True                # the rounds emitted exactly the recorded greedy output


def replay(rec: Recording, mode: str, controller: Callable[..., Controller] = Controller,
           k_max: int = 8, ngram_order: int = 3, eagle: EagleReplay | None = None,
           auto_excludes: frozenset[str] = frozenset(), charge_misses: bool = False,
           window: int = DRAFTING.catch_up_window) -> Replay:
    """Replay `mode` (ngram | draft | eagle | eagle-tree | auto) on the recording: the engine's own rounds
    (decoding/round.py), verified against the recorded greedy output; `auto` offers the EAGLE drafters too when `eagle` is
    given, less `auto_excludes` (NOT_AUTO: as the runtime's). controller: the Controller class (or a factory with
    its signature) to judge: the default is the shipped one. charge_misses: the draft model's chains go on
    past a miss; window: its catch-up window (RecordedDraft)."""
    from speczoo.decoding.drafters.ngram import NgramDrafter

    if mode not in MODES + EAGLE_MODES:
        raise ValueError(f"mode must be one of {MODES + EAGLE_MODES}, got {mode!r}")
    if mode in EAGLE_MODES and eagle is None:
        raise ValueError(f"mode {mode} needs an EAGLE head to replay")
    drafters: dict[str, Drafter] = {}
    if mode in ("ngram", "auto"):
        drafters["ngram"] = NgramDrafter(max_order=ngram_order)
    if mode in ("draft", "auto"):
        drafters["draft"] = RecordedDraft(rec, charge_misses=charge_misses, window=window)
    price = {"ngram": 0.0, "draft": rec.draft_step}
    readers: list = []
    if eagle is not None and mode in ("auto", *EAGLE_MODES):
        from speczoo.cache import KVCache
        from speczoo.decoding.drafters.eagle import EagleDrafter

        rows = len(rec.prompt) + len(rec.out) + k_max * eagle.tree.depth * eagle.tree.branch + 2
        for name, tree in (("eagle", None), ("eagle-tree", eagle.tree)):
            if mode == name or (mode == "auto" and name not in auto_excludes):
                drafters[name] = EagleDrafter(eagle.head, KVCache(eagle.head.kv_args(), rows), tree=tree)
                readers.append(drafters[name])
        price["eagle"], price["eagle-tree"] = eagle.step, eagle.step / eagle.tree.branch   # as runtime.py
    costs = Costs(cv=CvCurve.measured(rec.target_cv), draft_cost={n: price[n] for n in drafters},
                  round_overhead=rec.round_overhead)
    ctl = controller(costs, list(drafters), k_max=k_max,
                     priors={n: d.situation_priors for n, d in drafters.items()},
                     confident={n for n, d in drafters.items() if d.stops_on_confidence})
    p = len(rec.prompt)
    for d in drafters.values():
        d.reset()
        if d in readers:
            d.observe([h[:p] for h in eagle.features])          # the prompt's features come first
        d.prefill(rec.prompt)
    out, n, cost, rounds = rec.out, len(rec.out), 0.0, 0
    steps0 = sum(d.steps for d in readers)                   # head steps from here on are the rounds'
    by: dict[str, int] = {}

    def verify(g: Generation, plan: RoundPlan):                   # run_round's Verifier: the recording's verdict
        i = len(g.out)                                       # out[i] is this round's a0
        verdict, judged = verify_recorded(plan, out, i)
        for d in readers:                                    # a0 and the accepted tokens, to every head
            d.observe([h[p + i:p + i + 1 + verdict.accepted] for h in eagle.features])
        return verdict, judged

    g = Generation(drafters, ctl, list(rec.prompt), n)
    g.start(out[0])
    while g.finish is None:
        r = run_round(g, verify)
        cost += costs.cv(r.drafted + 1) + costs.round_overhead if r.drafted else 1.0
        name = r.drafter if r.drafted else NONE
        by[name] = by.get(name, 0) + 1
        rounds += 1
    head_steps = sum(d.steps for d in readers) - steps0
    cost += sum(getattr(d, "spent", 0.0) for d in drafters.values()) + head_steps * (eagle.step if eagle else 0.0)
    return Replay(speedup=n / cost, rounds=rounds, by_drafter=by, cost=cost, lossless=g.out == out)


def record(rt, prompt_ids: list[int], gen: int) -> Recording:
    """Run the target greedily on the prompt and the draft teacher-forced over the output; take the
    costs from the runtime's profiles (the draft's own c_v curve included)."""
    from speczoo.decoding.pricing.profile import load_or_measure
    from benchmarks.draft_replay import teacher

    t = teacher(rt, prompt_ids, gen)
    tp, dp = load_or_measure(rt.target, draft_head=reduced_head), load_or_measure(rt.draft, draft_head=reduced_head)
    step_ms = dp.get("draft_ms", dp["ms"]["1"])
    head_saving = dp["ms"]["1"] - step_ms         # a catch-up forward ends in the same reduced head
    draft_cv = {int(s): (ms - head_saving) / step_ms for s, ms in dp["ms"].items()}
    return Recording(prompt=prompt_ids, out=t.out, guess=t.guess, sure=t.sure,
                     target_cv={int(s): c for s, c in tp["cv"].items()}, draft_cv=draft_cv,
                     draft_step=step_ms / tp["ms"]["1"], round_overhead=PRICING.round_overhead)


def eagle_features(target: str, head_name: str, tree: str, recs: dict[str, Recording],
                   step: float | None = None) -> dict[str, EagleReplay]:
    """Per recording, the head and the target's features at its layers over prompt + output (one
    teacher-forced forward each), with the head's step priced as the runtime prices it (or at `step`)."""
    import torch

    from speczoo.cache import KVCache
    from speczoo.runtime import load
    from speczoo.decoding.drafters.eagle import TreeShape
    from speczoo.eagle_drafters import head_step_cost, load_for
    from speczoo.zoo.heads import find_head

    depth, branch = (int(x) for x in tree.split(","))
    t = load(target)
    head = load_for(find_head(head_name), t.model, target, t.backend)
    if step is None:
        step = head_step_cost(head, t.model, t.model.args)
    print(f"EAGLE head {head_name}: a draft step costs {step:.3f} target steps", flush=True)
    out = {}
    for name, rec in recs.items():
        ids = rec.prompt + rec.out
        cache = KVCache(t.args, len(ids) + 1)
        with torch.no_grad():
            fwd = t.model(torch.tensor(ids), torch.arange(len(ids)), cache,
                          readout=Readout(logit_rows=slice(-1, None), hidden_layers=head.cfg.target_layers))
        out[name] = EagleReplay(head=head, step=step, tree=TreeShape(depth, branch), features=fwd.hidden)
    return out


def load_recordings(path: Path) -> dict[str, Recording]:
    rows = json.loads(Path(path).read_text())
    out = {}
    for name, r in rows.items():
        r["target_cv"] = {int(s): c for s, c in r["target_cv"].items()}
        r["draft_cv"] = {int(s): c for s, c in r["draft_cv"].items()}
        out[name] = Recording(**r)
    return out


def replay_all(recs: dict[str, Recording], modes: Sequence[str], k_max: int = 8,
               heads: dict[str, EagleReplay] | None = None, auto_excludes: frozenset[str] = frozenset(),
               controller: Callable[..., Controller] = Controller, charge_misses: bool = False,
               window: int = DRAFTING.catch_up_window) -> dict[str, dict[str, Replay]]:
    """Every recording under every mode: {recording: {mode: Replay}}."""
    heads = heads or {}
    return {name: {m: replay(rec, m, controller, k_max=k_max, eagle=heads.get(name), auto_excludes=auto_excludes,
                             charge_misses=charge_misses, window=window)
                   for m in modes}
            for name, rec in recs.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--prompts", default="verbatim,code_edit,extractive_qa,free_form", help="built-in prompts")
    ap.add_argument("--suite", type=int, default=0, metavar="N",
                    help="record the first N questions of each category of the built-in suite instead of "
                         "the built-in prompts (first turns)")
    ap.add_argument("--gen", type=int, default=256, help="new tokens per prompt")
    ap.add_argument("--k", type=int, default=8, help="the most draft tokens per round")
    ap.add_argument("--record", type=Path, default=None, help="also save the recordings to this JSON file")
    ap.add_argument("--replay", type=Path, default=None, help="replay saved recordings (no model runs)")
    ap.add_argument("--profile", action="append", default=[], metavar="NAME|FILE.json",
                    help=f"replay under this cost profile instead of the recordings' own: one of "
                         f"{', '.join(PROFILES)}, or a target's profile file as decoding/pricing/profile.py saves it; "
                         "comma-separated or repeated for several")
    ap.add_argument("--draft-profile", type=Path, default=None, metavar="FILE.json",
                    help="the draft model's profile file, pricing its step against a measured --profile")
    ap.add_argument("--draft-ratio", type=float, default=None,
                    help="price the draft step at this fraction of a target step instead of the profiles'")
    ap.add_argument("--each", action="store_true", help="also print one row per recording")
    ap.add_argument("--charge-misses", action="store_true",
                    help="the draft model's chains go on past their first wrong token until its floors or K "
                         "stop them, each further token charged a step (its confidences there: those on the "
                         "right text)")
    ap.add_argument("--catch-up-window", type=int, default=DRAFTING.catch_up_window, metavar="N",
                    help="the draft model's catch-up feeds at most N missed ids (0: all; default "
                         f"{DRAFTING.catch_up_window}, the engine's)")
    ap.add_argument("--head", default=None, help="also replay this installed EAGLE head (eagle, eagle-tree, "
                    "and inside auto); its features come from one target forward per recording")
    ap.add_argument("--tree", default="6,4", metavar="DEPTH,BRANCH", help="eagle-tree's shape (default 6,4)")
    ap.add_argument("--eagle-step", type=float, default=None,
                    help="price the head's step at this fraction of a target step instead of timing it now")
    args = ap.parse_args(argv)
    profiles = [load_profile(p, args.draft_profile) for spec in args.profile for p in spec.split(",") if p]
    if args.draft_profile is not None and not profiles:
        raise ValueError("--draft-profile prices the draft against a measured --profile FILE.json; give one")

    if args.replay:
        recs = load_recordings(args.replay)
    else:
        recs = record_all(args)
    heads = eagle_features(args.target, args.head, args.tree, recs, args.eagle_step) if args.head else {}
    modes = ("ngram", "draft", *(EAGLE_MODES if heads else ()), "auto")
    holds = True
    for profile in profiles or [None]:
        priced = recs if profile is None else {n: profile.apply(r) for n, r in recs.items()}
        if args.draft_ratio is not None:
            priced = {n: replace(r, draft_step=args.draft_ratio) for n, r in priced.items()}
        title = "recordings' own costs" if profile is None else profile.describe()
        print(title if args.draft_ratio is None else f"{title} (draft step {args.draft_ratio:g})")
        results = replay_all(priced, modes, args.k, heads, NOT_AUTO, charge_misses=args.charge_misses,
                             window=args.catch_up_window)
        holds &= print_report(priced, results, modes, args.each).holds
        print()
    if len(profiles) > 1:
        print(f"auto >= {AUTO_FLOOR:.2f}x greedy under every profile: {'HOLDS' if holds else 'FAILS'}")
    return 0


def record_all(args) -> dict[str, Recording]:
    """Run the target (and the draft, teacher-forced) on the prompts or suite questions; save them to
    --record when asked."""
    from speczoo.bench.prompts import builtin_prompt
    from speczoo.commands.suite import draft_to_load
    from speczoo.runtime import load_runtime

    if args.suite:
        from speczoo.bench.questions import builtin_questions, select
        texts = {f"{q.category}-{q.question_id}": q.turns[0]
                 for q in select(builtin_questions(), limit=args.suite)}
    else:
        texts = {name: builtin_prompt(name).message for name in args.prompts.split(",")}
    draft = draft_to_load(args.target, ["draft"], None)
    if draft is None:
        raise ValueError(f"{args.target} has no draft model in the zoo to replay")
    rt = load_runtime(args.target, draft)
    recs = {name: record(rt, rt.chat_ids([{"role": "user", "content": text}]), args.gen)
            for name, text in texts.items()}
    if args.record:
        tmp = args.record.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: asdict(r) for n, r in recs.items()}))
        tmp.replace(args.record)
    return recs


if __name__ == "__main__":
    raise SystemExit(main())

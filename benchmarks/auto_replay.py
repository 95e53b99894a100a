"""What each speculative mode's controller would do, round by round, replayed offline from one greedy run.

    python -m benchmarks.auto_replay [TARGET] [--prompts free_form,...] [--suite N] [--gen 256]
                                     [--record FILE | --replay FILE] [--draft-ratio R] [--head NAME]
                                     [--profile NAME|FILE.json ...] [--draft-profile FILE.json] [--each]

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
    does, decoding/calibrate.py);
  * the verify: the target's c_v(K + 1) plus the round overhead; a plain round: 1.
With `--head NAME` an EAGLE head joins in: one teacher-forced target forward per recording gives the
features the engine would hand it, and the real EagleDrafter (chain and tree) drafts from them, round
by round, as in the engine; a round costs its head steps (a batched catch-up counts as one) and the
target's c_v over the chain or the flattened tree.
So `auto` can be compared with each single drafter on the same text, and a change to the controller
judged in seconds, without the timing noise of a live benchmark (`python -m benchmarks.drafters`
measures the real thing). The draft's confidences after its first wrong token are not observable
offline; the replay stops its chain there in every mode alike.

Cost profiles: the recordings carry the costs measured when they were made, but `auto` must hold on
every kernel path, whatever its costs. `--profile NAME` replays them under a built-in profile of one
path's shape (PROFILES: cheap-verify, dear-verify, dear-draft), `--profile FILE.json` under a measured
one (a target's profile as bench/cv.py saves it, `speczoo cv MODEL --json` or a bundle's
cost-<backend>.json; the draft's with `--draft-profile`). The controller is then handed exactly those
costs, as if the engine's meter had already learnt them. The report is per category of the suite (the
recordings' `{category}-{question_id}` names; a built-in prompt is a category of its own): each mode's
output tokens per modeled target step, against plain greedy's 1.0, and whether `auto` holds
AUTO_FLOOR × greedy in every category. A measurement script, never imported by the runtime: it must
never run a model when replaying, and never change a recording's tokens, only the prices.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from speczoo.decoding.controller import NONE, Controller, Costs
from speczoo.decoding.cost import CvCurve
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.draft_model import GUESS_MAX, agreeing_prefix
from speczoo.decoding.drafters.guess import Guesser
from speczoo.decoding.tree import TreeLayout, head, is_chain, verify_tree_greedy
from speczoo.decoding.types import Draft

MODES = ("ngram", "draft", "auto")
EAGLE_MODES = ("eagle", "eagle-tree")
AUTO_FLOOR = 0.97       # `auto` must keep at least this share of plain greedy's speed, in every category


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
    round_overhead: float = 0.02


class RecordedDraft(Drafter):
    """The draft model as the recording saw it: proposes its recorded argmax chain (stopping on the
    controller's floors, or after its first wrong token), keeps `fed` as DraftModelDrafter does, sizes
    and judges its prompt-lookup guesses with the real Guesser (decoding/drafters/guess.py: a forward over
    the guessed ids as well; each the draft confirms saves a step), and reports each proposal's cost in
    target steps through `spent`."""

    name = "draft"
    stops_on_confidence = True

    def __init__(self, rec: Recording, guesses: bool = True):
        self.rec = rec
        self.fed: list[int] = []
        self.spent = 0.0
        self._cv = CvCurve.measured(rec.draft_cv) if rec.draft_cv else CvCurve.constant(1.0)
        self.guesser = Guesser(self._cv, GUESS_MAX) if guesses else None

    def reset(self) -> None:
        self.fed = []
        if self.guesser is not None:
            self.guesser.reset()

    def lag(self, context: list[int]) -> int:
        return len(context) - 1 - agreeing_prefix(self.fed, context)

    def prefill(self, prompt: list[int]) -> None:
        self.fed = list(prompt[:-1])

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        r = self.rec
        feed = len(context) - agreeing_prefix(self.fed, context)  # catch-up ids + the last context id
        self.fed = list(context)
        j = len(context) - len(r.prompt)                         # the output index the first token predicts
        tokens: list[int] = []
        sure = 1.0
        end = False
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
                if i < len(floors):
                    sure *= r.sure[j + i]
                # what follows a miss was not recorded
                end = t != r.out[j + i] or i + 1 == k or (i < len(floors) and sure < floors[i])
                agreed = m < len(g) and g[m] == t
                confirmed += agreed
                if end or not agreed:
                    censored = end and agreed
                    break
            if g:
                self.guesser.judge(len(g), confirmed, censored)
            feed = 1
        self.fed.extend(tokens[:-1])
        return Draft(tokens=tokens, drafter=self.name)

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
           auto_excludes: frozenset[str] = frozenset()) -> Replay:
    """Replay `mode` (ngram | draft | eagle | eagle-tree | auto) on the recording, as the engine's round
    loop would run it with greedy verification; `auto` offers the EAGLE drafters too when `eagle` is
    given, less `auto_excludes` (as the runtime's). controller: the Controller class (or a factory with
    its signature) to judge: the default is the shipped one."""
    from speczoo.decoding.drafters.ngram import NgramDrafter

    if mode not in MODES + EAGLE_MODES:
        raise ValueError(f"mode must be one of {MODES + EAGLE_MODES}, got {mode!r}")
    if mode in EAGLE_MODES and eagle is None:
        raise ValueError(f"mode {mode} needs an EAGLE head to replay")
    drafters: dict[str, Drafter] = {}
    if mode in ("ngram", "auto"):
        drafters["ngram"] = NgramDrafter(max_order=ngram_order)
    if mode in ("draft", "auto"):
        drafters["draft"] = RecordedDraft(rec)
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
    out, n, i, cost, rounds = rec.out, len(rec.out), 0, 0.0, 0
    emitted: list[int] = []                                  # what the rounds commit: the pending id + accepted
    head_steps = 0
    by: dict[str, int] = {}
    while i < n:
        ctx = rec.prompt + out[:i + 1]                           # committed ids + the pending out[i]
        remaining = n - i
        choice = None
        if remaining > 1:
            lags = {name: d.lag(ctx) for name, d in drafters.items()}
            choice = ctl.choose(lags, {name: d.situation(ctx) for name, d in drafters.items()})
        draft = Draft(tokens=[])
        steps0 = sum(d.steps for d in readers)
        if choice is not None and choice.drafting:
            k = min(choice.k, remaining - 1)
            draft = head(drafters[choice.drafter].propose(ctx, k, choice.floors), k)
            if not draft.tokens:
                alt = ctl.alternative(choice.drafter, lags)
                choice = alt
                if alt.drafting:
                    k = min(alt.k, remaining - 1)
                    draft = head(drafters[alt.drafter].propose(ctx, k, alt.floors), k)
        head_steps += sum(d.steps for d in readers) - steps0
        accepted = 0
        if draft.tokens and not is_chain(draft.parents):
            layout = TreeLayout.from_parents(draft.parents)
            truth = out[i + 1:]
            depth = layout.depth.tolist()                       # row r predicts the token at depth[r] + 1
            ids = [truth[d] if d < len(truth) else -1 for d in depth]
            verdict = verify_tree_greedy(draft, layout, ids)
            accepted = verdict.accepted
            emitted += [out[i]] + [draft.tokens[r] for r in verdict.path]
            drafters[choice.drafter].commit_path(verdict.path)
            ctl.update(choice.drafter, layout.judged(verdict.path), accepted)
            cost += costs.cv(draft.k + 1) + costs.round_overhead
        elif draft.tokens:
            while accepted < len(draft.tokens) and draft.tokens[accepted] == out[i + 1 + accepted]:
                accepted += 1
            emitted += [out[i]] + draft.tokens[:accepted]
            drafters[choice.drafter].commit(accepted)
            ctl.update(choice.drafter, len(draft.tokens), accepted)
            cost += costs.cv(len(draft.tokens) + 1) + costs.round_overhead
        else:
            cost += 1.0
            emitted.append(out[i])
        for d in readers:                                        # a0 and the accepted tokens, to every head
            d.observe([h[p + i:p + i + 1 + accepted] for h in eagle.features])
        name = choice.drafter if draft.tokens else NONE
        by[name] = by.get(name, 0) + 1
        rounds += 1
        i += 1 + accepted
    cost += sum(getattr(d, "spent", 0.0) for d in drafters.values()) + head_steps * (eagle.step if eagle else 0.0)
    return Replay(speedup=n / cost, rounds=rounds, by_drafter=by, cost=cost, lossless=emitted == out)


def record(rt, prompt_ids: list[int], gen: int) -> Recording:
    """Run the target greedily on the prompt and the draft teacher-forced over the output; take the
    costs from the runtime's profiles (the draft's own c_v curve included)."""
    from speczoo.bench.cv import load_or_measure
    from benchmarks.draft_replay import teacher

    t = teacher(rt, prompt_ids, gen)
    tp, dp = load_or_measure(rt.target), load_or_measure(rt.draft)
    step_ms = dp.get("draft_ms", dp["ms"]["1"])
    head_saving = dp["ms"]["1"] - step_ms         # a catch-up forward ends in the same reduced head
    draft_cv = {int(s): (ms - head_saving) / step_ms for s, ms in dp["ms"].items()}
    return Recording(prompt=prompt_ids, out=t.out, guess=t.guess, sure=t.sure,
                     target_cv={int(s): c for s, c in tp["cv"].items()}, draft_cv=draft_cv,
                     draft_step=step_ms / tp["ms"]["1"], round_overhead=0.02)


def eagle_features(target: str, head_name: str, tree: str, recs: dict[str, Recording],
                   step: float | None = None) -> dict[str, EagleReplay]:
    """Per recording, the head and the target's features at its layers over prompt + output (one
    teacher-forced forward each), with the head's step priced as the runtime prices it (or at `step`)."""
    import torch

    from speczoo.cache import KVCache
    from speczoo.runtime import load
    from speczoo.decoding.drafters.eagle import TreeShape
    from speczoo.decoding.eagle.loaded import EagleHeads

    depth, branch = (int(x) for x in tree.split(","))
    t = load(target)
    heads = EagleHeads(target, t.model, max_seq=4096, backend=t.backend)
    entry = heads.resolve("eagle:" + head_name)
    head = heads.head(entry)
    if step is None:
        step = heads.step_cost(entry)
    print(f"EAGLE head {head_name}: a draft step costs {step:.3f} target steps", flush=True)
    out = {}
    for name, rec in recs.items():
        ids = rec.prompt + rec.out
        cache = KVCache(t.args, len(ids) + 1)
        with torch.no_grad():
            fwd = t.model(torch.tensor(ids), torch.arange(len(ids)), cache, hidden_layers=head.cfg.target_layers,
                          logit_rows=slice(-1, None))
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


# -- cost profiles ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """A machine's costs to replay recordings under, in target decode steps (one plain step = 1.0).

    target_cv:      the target's c_v(S) (S = 1 is 1.0).
    draft_step:     the draft model's step; None keeps each recording's.
    draft_cv:       the draft's own forward cost over S rows, in draft steps; None keeps the recording's.
    round_overhead: the fixed extra cost of a speculative round.
    """
    name: str
    target_cv: dict[int, float]
    draft_step: float | None = None
    draft_cv: dict[int, float] | None = None
    round_overhead: float = 0.02

    def __post_init__(self) -> None:
        CvCurve.measured(self.target_cv, source=self.name)          # raises on a malformed curve
        if self.draft_cv is not None:
            CvCurve.measured(self.draft_cv, source=self.name)
        if self.draft_step is not None and not 0.0 <= self.draft_step < 10.0:
            raise ValueError(f"profile {self.name}: a draft step of {self.draft_step} target steps is not a "
                             "cost; give it relative to one target decode step (0.3 = 30%)")

    def apply(self, rec: Recording) -> Recording:
        """The recording with this profile's prices (its tokens and confidences unchanged)."""
        return replace(rec, target_cv=dict(self.target_cv),
                       draft_cv=dict(rec.draft_cv if self.draft_cv is None else self.draft_cv),
                       draft_step=rec.draft_step if self.draft_step is None else self.draft_step,
                       round_overhead=self.round_overhead)

    def describe(self) -> str:
        cv = " ".join(f"{s}:{c:.2f}" for s, c in sorted(self.target_cv.items()))
        step = "the recordings'" if self.draft_step is None else f"{self.draft_step:.2f}"
        return f"profile {self.name}: c_v {{{cv}}}, draft step {step}, round overhead {self.round_overhead:g}"


# The three shapes a kernel path gives the costs. The draft's own rows follow the target's curve (both
# run on the same kernels; the controller's catch-up assumes as much). How each was chosen: docs/tuning.md.
ZEN4_CV = {1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}   # AVX-512 VNNI, `speczoo cv`, 2026-11-30
DEAR_CV = {1: 1.0, 2: 1.6, 3: 2.1, 5: 3.05, 9: 5.0, 17: 7.5}      # between llama.cpp's 0.5B and 1.5B curves
PROFILES = {
    # a verify of up to 5 rows costs about one step; the draft 0.28 of a step (the product's figures)
    "cheap-verify": Profile("cheap-verify", ZEN4_CV, 0.28, ZEN4_CV),
    # every verify row costs about half a step more (a slow path, or llama.cpp's own forward)
    "dear-verify": Profile("dear-verify", DEAR_CV, 0.35, DEAR_CV),
    # a cheap verify, but a draft step costs 0.8 of the target's (llama.cpp measured 0.71 for this pair)
    "dear-draft": Profile("dear-draft", ZEN4_CV, 0.8, ZEN4_CV),
}


def measured_profile(target: dict, draft: dict | None = None, name: str = "measured") -> Profile:
    """A profile from bench/cv.py's saved form: the target's {"ms", "cv"}; the draft's step from the
    draft model's profile ("draft_ms", its reduced-head step, else its "ms" at S = 1), over the target's
    step, and its rows from its "draft_cv" (else "cv"), as runtime_costs prices them."""
    cv = _curve(target, "cv", name)
    if draft is None:
        return Profile(name, cv)
    t_ms, d_ms = _ms1(target, name), draft.get("draft_ms", _ms1(draft, name + " (draft)"))
    rows = _curve(draft, "draft_cv" if "draft_cv" in draft else "cv", name + " (draft)")
    return Profile(name, cv, float(d_ms) / t_ms, rows)


def _curve(data: dict, key: str, name: str) -> dict[int, float]:
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise ValueError(f"{name}: no {key!r} table; expected a cost profile as bench/cv.py saves it "
                         '({"ms": {"1": ...}, "cv": {"1": 1.0, "2": ...}}: `speczoo cv MODEL --json`)')
    try:
        return {int(s): float(c) for s, c in data[key].items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: its {key!r} table must map S to a number, got {data[key]!r}") from exc


def _ms1(data: dict, name: str) -> float:
    ms = data.get("ms", {}).get("1") if isinstance(data.get("ms"), dict) else None
    if ms is None or not float(ms) > 0:
        raise ValueError(f"{name}: no positive \"ms\" at S = 1; the draft's step is priced against the "
                         "target's decode step, so both profiles need their times")
    return float(ms)


def load_profile(spec: str, draft_file: Path | None = None) -> Profile:
    """A built-in profile by name, or a measured one from a target's profile file (and a draft's)."""
    if spec in PROFILES:
        if draft_file is not None:
            raise ValueError(f"--draft-profile goes with a measured --profile FILE.json, not with {spec}")
        return PROFILES[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"unknown profile {spec!r}: name one of {', '.join(PROFILES)}, or give a cost "
                         "profile file (`speczoo cv MODEL --json > F.json`, or a bundle's cost-<backend>.json)")
    draft = json.loads(Path(draft_file).read_text()) if draft_file is not None else None
    return measured_profile(json.loads(path.read_text()), draft, name=path.name)


# -- per-category report ------------------------------------------------------------------------------

def category_of(name: str) -> str:
    """A suite recording's category (`{category}-{question_id}`); a built-in prompt is its own."""
    head_, _, tail = name.rpartition("-")
    return head_ if head_ and tail.isdigit() else name


@dataclass
class Tally:
    """One category's recordings replayed: output tokens, and target steps spent per mode."""
    recordings: int = 0
    tokens: int = 0
    cost: dict[str, float] = field(default_factory=dict)
    lossless: bool = True

    def add(self, tokens: int, results: dict[str, Replay]) -> None:
        self.recordings += 1
        self.tokens += tokens
        for mode, r in results.items():
            self.cost[mode] = self.cost.get(mode, 0.0) + r.cost
            self.lossless &= r.lossless

    def speedup(self, mode: str) -> float:
        """Tokens per modeled target step against plain greedy's 1.0 (greedy spends a step per token)."""
        return self.tokens / self.cost[mode]

    def gap(self) -> float:
        """`auto` against the best single mode here: auto / best − 1."""
        return self.speedup("auto") / max(self.speedup(m) for m in self.cost if m != "auto") - 1.0


@dataclass
class Verdict:
    holds: bool             # `auto` ≥ AUTO_FLOOR × greedy in every category, and every replay lossless
    worst: str              # the category where `auto` is slowest against greedy
    worst_speedup: float
    mean_gap: float         # `auto` against the best single mode, mean over categories
    worst_gap: float
    worst_gap_category: str


def tally(recs: dict[str, Recording], results: dict[str, dict[str, Replay]]) -> dict[str, Tally]:
    """Per category, in the recordings' order."""
    out: dict[str, Tally] = {}
    for name, rec in recs.items():
        out.setdefault(category_of(name), Tally()).add(len(rec.out), results[name])
    return out


def verdict(cats: dict[str, Tally], floor: float = AUTO_FLOOR) -> Verdict:
    if not cats:
        raise ValueError("no recordings to judge")
    worst = min(cats, key=lambda c: cats[c].speedup("auto"))
    gaps = {c: t.gap() for c, t in cats.items()}
    worst_gap = min(gaps, key=gaps.__getitem__)
    ok = cats[worst].speedup("auto") >= floor and all(t.lossless for t in cats.values())
    return Verdict(ok, worst, cats[worst].speedup("auto"), sum(gaps.values()) / len(gaps), gaps[worst_gap],
                   worst_gap)


def replay_all(recs: dict[str, Recording], modes: Sequence[str], k_max: int = 8,
               heads: dict[str, EagleReplay] | None = None, auto_excludes: frozenset[str] = frozenset(),
               controller: Callable[..., Controller] = Controller) -> dict[str, dict[str, Replay]]:
    """Every recording under every mode: {recording: {mode: Replay}}."""
    heads = heads or {}
    return {name: {m: replay(rec, m, controller, k_max=k_max, eagle=heads.get(name), auto_excludes=auto_excludes)
                   for m in modes}
            for name, rec in recs.items()}


def print_report(recs: dict[str, Recording], results: dict[str, dict[str, Replay]], modes: Sequence[str],
                 each: bool = False) -> Verdict:
    """The per-category table (and, with `each`, one row per recording) and the verdict line."""
    cats = tally(recs, results)
    width = max(14, *(len(c) for c in cats), *(len(n) + 2 for n in recs if each))
    print(f"{'category':{width}s} {'tokens':>6s} " + " ".join(f"{m:>10s}" for m in modes)
          + "  auto vs best  lossless")
    for cat, t in cats.items():
        print(f"{cat:{width}s} {t.tokens:6d} " + " ".join(f"{t.speedup(m):9.2f}x" for m in modes)
              + f"  {t.gap():+6.1%}       {'yes' if t.lossless else 'NO'}")
        if each:
            for name, rec in recs.items():
                if category_of(name) == cat and name != cat:
                    _print_recording(name, rec, results[name], modes, width)
    v = verdict(cats)
    print(f"auto >= {AUTO_FLOOR:.2f}x greedy in every category: {'HOLDS' if v.holds else 'FAILS'} "
          f"(slowest: {v.worst} {v.worst_speedup:.2f}x); auto against the best single mode: mean "
          f"{v.mean_gap:+.1%}, worst {v.worst_gap:+.1%} ({v.worst_gap_category})", flush=True)
    return v


def _print_recording(name: str, rec: Recording, res: dict[str, Replay], modes: Sequence[str], width: int) -> None:
    gap = res["auto"].speedup / max(res[m].speedup for m in modes if m != "auto") - 1
    mix = " ".join(f"{d} {c}" for d, c in sorted(res["auto"].by_drafter.items()))
    print(f"  {name:{width - 2}s} {len(rec.out):6d} " + " ".join(f"{res[m].speedup:9.2f}x" for m in modes)
          + f"  {gap:+6.1%}       auto's rounds: {mix}")


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
                         f"{', '.join(PROFILES)}, or a target's profile file as bench/cv.py saves it; "
                         "comma-separated or repeated for several")
    ap.add_argument("--draft-profile", type=Path, default=None, metavar="FILE.json",
                    help="the draft model's profile file, pricing its step against a measured --profile")
    ap.add_argument("--draft-ratio", type=float, default=None,
                    help="price the draft step at this fraction of a target step instead of the profiles'")
    ap.add_argument("--each", action="store_true", help="also print one row per recording")
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
    from speczoo.runtime import AUTO_EXCLUDES

    heads = eagle_features(args.target, args.head, args.tree, recs, args.eagle_step) if args.head else {}
    modes = ("ngram", "draft", *(EAGLE_MODES if heads else ()), "auto")
    holds = True
    for profile in profiles or [None]:
        priced = recs if profile is None else {n: profile.apply(r) for n, r in recs.items()}
        if args.draft_ratio is not None:
            priced = {n: replace(r, draft_step=args.draft_ratio) for n, r in priced.items()}
        title = "recordings' own costs" if profile is None else profile.describe()
        print(title if args.draft_ratio is None else f"{title} (draft step {args.draft_ratio:g})")
        results = replay_all(priced, modes, args.k, heads, AUTO_EXCLUDES)
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

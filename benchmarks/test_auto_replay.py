"""The offline replay of the speculative modes (benchmarks/auto_replay.py, its profiles and report) on hand-made
recordings."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from benchmarks.auto_replay import (
    MODES,
    EagleReplay,
    Recording,
    RecordedDraft,
    load_recordings,
    main,
    replay,
    replay_all,
)
from benchmarks.replay_profiles import PROFILES, Profile, load_profile, measured_profile
from benchmarks.replay_report import AUTO_FLOOR, category_of, tally, verdict
from speczoo.cache import KVCache
from speczoo.request import GenerationRequest
from speczoo.decoding.drafters.eagle import TreeShape, make_eagle_drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.models.forward import Readout
from offered import offered
from tiny import tiny_model
from tiny_eagle import PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/fixtures.py

FLAT = {1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0, 9: 1.0, 17: 1.0}
DATA = Path(__file__).parent / "data"


def recording(out, guess, sure=0.99, prompt=(1, 2, 3, 4, 5), draft_step=0.1) -> Recording:
    return Recording(prompt=list(prompt), out=list(out), guess=list(guess), sure=[sure] * len(out),
                     target_cv=dict(FLAT), draft_cv=dict(FLAT), draft_step=draft_step, round_overhead=0.0)


def test_a_draft_that_is_always_right_drafts_deep_and_pays_for_each_step():
    out = list(range(100, 190))
    res = replay(recording(out, out), "draft")
    # chains of 8 accepted (9 tokens a round) after the first rounds; each round costs 1 + 8 draft steps
    assert res.speedup > 9 / (1 + 0.8) * 0.9 and res.rounds <= 14
    assert res.by_drafter == {"draft": res.rounds}


def test_a_draft_that_is_always_wrong_is_mostly_switched_off():
    """At a draft step of 0.1 break-even is α ≈ 0.1, which the controller's faded evidence keeps
    re-trying now and then: the loss stays under 10%."""
    out = list(range(100, 400))
    res = replay(recording(out, [t + 1 for t in out], sure=0.3), "draft")
    assert 0.9 < res.speedup <= 1.0 and res.by_drafter.get("none", 0) > res.rounds / 2


def test_charged_misses_pay_for_a_chain_drafted_past_its_first_wrong_token():
    """With --charge-misses a sure draft that is wrong every fifth token goes on to K past each miss, each
    further token a step; the tokens kept, and so the output, are the same, the cost higher. The draft's
    confidences come with its chains (and nothing else when it has no floors)."""
    out = list(range(100, 300))
    guess = [t + 1 if i % 5 == 4 else t for i, t in enumerate(out)]
    rec = recording(out, guess, sure=0.999)
    free, charged = replay(rec, "draft"), replay(rec, "draft", charge_misses=True)
    assert free.lossless and charged.lossless
    assert charged.cost > free.cost
    d = RecordedDraft(rec, guesses=False, charge_misses=True)
    d.prefill(rec.prompt)
    ctx = rec.prompt + out[:1]
    chain = d.propose(ctx, 8, floors=(0.5,) * 7)
    assert chain.tokens == guess[1:9] and chain.confidences == [0.999] * 8    # past the miss at out[4]
    assert RecordedDraft(rec, guesses=False).propose(ctx, 8, floors=(0.5,) * 7).tokens == guess[1:5]
    assert RecordedDraft(rec, guesses=False).propose(ctx, 8).confidences is None


def test_prompt_lookup_copies_a_repeated_text_and_auto_follows_it():
    text = list(range(200, 400))
    prompt = text + [9]
    res = {m: replay(recording(text, [0] * len(text), sure=0.2, prompt=prompt), m) for m in ("ngram", "auto")}
    assert res["ngram"].speedup > 3
    assert res["auto"].speedup > 0.9 * res["ngram"].speedup


def test_the_recorded_draft_lags_as_the_real_one():
    """fed/lag bookkeeping: after a round the draft has fed the context and all but its last token."""
    out = list(range(100, 120))
    d = RecordedDraft(recording(out, out))
    d.prefill([1, 2, 3, 4, 5])
    ctx = [1, 2, 3, 4, 5, 100]
    assert d.lag(ctx) == 1                                   # the last prompt id is fed with the pending one
    draft = d.propose(ctx, 3)
    assert draft.tokens == [101, 102, 103] and d.fed == ctx + [101, 102]
    assert d.lag(ctx + [101, 102, 103, 104]) == 1          # all accepted: 103 and the bonus 104 are new
    assert d.lag(ctx + [101, 999]) == 0                      # one accepted, then the target's correction
    assert d.lag(ctx + [101, 102, 103, 104, 105, 106]) == 3


def test_recordings_round_trip_through_json(tmp_path):
    rec = recording([5, 6, 7], [5, 6, 8])
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"x": asdict(rec)}))
    back = load_recordings(f)["x"]
    assert back == rec


@pytest.mark.parametrize("tree", [None, TreeShape(depth=4, branch=3)], ids=["chain", "tree"])
def test_the_eagle_replay_makes_the_engines_rounds(trained, tree):  # trained: tests/conftest.py
    """At the engine's default prices (c_v 1, free drafts) the replay of an EAGLE head chooses, drafts
    and accepts round for round what the real engine does on the tiny target."""
    model, args, head = trained
    name = "eagle" if tree is None else "eagle-tree"
    factory = make_eagle_drafter(head, 128, tree)
    eng = Engine(model, KVCache(args, 128, extra=MAX_K + 1), offered({name: factory}), eos_ids=[],
                 max_seq=128)
    *events, done = eng.generate(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=40, spec=name, k=6))
    live = [(e.drafter, e.accepted) for e in events if e.ids]
    ids = PROMPT + done.ids
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), KVCache(args, len(ids) + 1),
                       readout=Readout(hidden_layers=head.cfg.target_layers)).hidden
    rec = recording(done.ids, done.ids, prompt=PROMPT, draft_step=0.0)
    eagle = EagleReplay(head=head, step=0.0, tree=tree or TreeShape(), features=hidden)
    spy: list[tuple[str, int]] = []
    res = replay(rec, name, k_max=6, eagle=eagle, controller=spying(spy))
    assert spy == live[:len(spy)] and len(spy) == len(live) - (live[-1][0] == "none")
    assert res.by_drafter.get(name, 0) >= len(live) - 2
    assert res.lossless                                      # the rounds emit the engine's output


def spying(log: list):
    """A Controller that logs (drafter, accepted) per drafted round, as the engine's events report it."""
    from speczoo.decoding.controller import Controller

    class Spy(Controller):
        def update(self, drafter, drafted, accepted, nodes=0, path=(), confidences=None):
            log.append((drafter, accepted))
            super().update(drafter, drafted, accepted, nodes, path, confidences)
    return Spy


def test_the_recorded_draft_guesses_as_the_real_one():
    """On a text that repeats, the draft's prompt-lookup guesses (decoding/drafters/guess.py) give the same
    chain for fewer forwards, and the replay charges it so."""
    text = list(range(200, 260))
    prompt = text + [9] + text[:5]
    out = text[5:40]
    spent = {}
    for guesses in (False, True):
        d = RecordedDraft(recording(out, out, prompt=prompt), guesses=guesses)
        d.reset()
        d.prefill(prompt)
        ctx = prompt + out[:1]
        assert d.propose(ctx, 8).tokens == out[1:9]
        spent[guesses] = d.spent
    assert spent[True] < 0.5 * spent[False]


# -- cost profiles: `auto` must hold plain greedy's speed whatever the machine's costs ------------------

def synthetic_suite(seeds=(0, 1), n: int = 160) -> dict[str, Recording]:
    """Recordings shaped like the suite's kinds of text, `{category}-{seed}`: a verbatim copy and an edit
    of the prompt (prompt lookup pays), free-form text the draft model gets right 60% of the time, hard
    text it gets right 25% of the time, and chatter over 30 ids (many short prompt-lookup matches that
    are wrong). The draft is sure of a right token, unsure of a wrong one."""
    import random

    out: dict[str, Recording] = {}
    for seed in seeds:
        rng = random.Random(seed)
        doc = [rng.randrange(1000, 5000) for _ in range(300)]
        kinds = {
            "copy": (doc + [7], doc[10:10 + n], 0.9),
            "edit": (doc + [7], [t if i % 12 else t + 7 for i, t in enumerate(doc[40:40 + n])], 0.8),
            "free": ([1, 2, 3, 4, 5], [rng.randrange(1000, 50000) for _ in range(n)], 0.6),
            "hard": ([1, 2, 3, 4, 5], [rng.randrange(1000, 50000) for _ in range(n)], 0.25),
            "chatter": ([1, 2, 3, 4, 5], [rng.randrange(10, 40) for _ in range(n)], 0.5),
        }
        for kind, (prompt, text, right) in kinds.items():
            hits = [rng.random() < right for _ in text]
            guess = [t if hit else t + 1 for t, hit in zip(text, hits)]
            sure = [rng.uniform(0.5, 1.0) if hit else rng.uniform(0.05, 0.6) for hit in hits]
            out[f"{kind}-{seed}"] = Recording(prompt=prompt, out=text, guess=guess, sure=sure)
    return out


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_auto_holds_greedy_in_every_category_under_every_profile(name):
    """The controller prices each round with the profile's costs: where speculation cannot pay (a dear
    verify, a dear draft) it decodes plainly, and its probes stay cheap, so no category falls below
    AUTO_FLOOR × greedy; every replay emits exactly the recorded greedy output."""
    recs = {n: PROFILES[name].apply(r) for n, r in synthetic_suite().items()}
    cats = tally(recs, replay_all(recs, MODES))
    assert set(cats) == {"copy", "edit", "free", "hard", "chatter"}
    for cat, t in cats.items():
        assert t.lossless, cat
        assert t.speedup("auto") >= AUTO_FLOOR, (cat, {m: round(t.speedup(m), 3) for m in MODES})
    assert verdict(cats).holds
    if name == "cheap-verify":              # where speculation pays, auto takes it
        assert cats["copy"].speedup("auto") > 3.5 and cats["free"].speedup("auto") > 1.2


def test_a_profile_reprices_a_recording_but_keeps_its_tokens():
    rec = recording([5, 6, 7], [5, 6, 8])
    priced = PROFILES["dear-draft"].apply(rec)
    assert (priced.prompt, priced.out, priced.guess, priced.sure) == (rec.prompt, rec.out, rec.guess, rec.sure)
    assert priced.draft_step == 0.8 and priced.target_cv[9] == PROFILES["dear-draft"].target_cv[9]
    assert rec.draft_step == 0.1                                 # the original is left alone
    assert Profile("kept", {1: 1.0, 2: 1.5}).apply(rec).draft_step == rec.draft_step


def test_a_measured_profile_is_read_as_bench_cv_saves_it(tmp_path):
    target = {"model": "t", "backend": "q4", "ms": {"1": 30.0, "2": 33.0, "9": 60.0},
              "cv": {"1": 1.0, "2": 1.1, "9": 2.0}}
    draft = {"model": "d", "backend": "q4", "ms": {"1": 12.0}, "cv": {"1": 1.0}, "draft_ms": 9.0,
             "draft_cv": {"1": 1.0, "2": 1.2}}
    (tmp_path / "t.json").write_text(json.dumps(target))
    (tmp_path / "d.json").write_text(json.dumps(draft))
    p = load_profile(str(tmp_path / "t.json"), tmp_path / "d.json")
    assert p.target_cv == {1: 1.0, 2: 1.1, 9: 2.0}
    assert p.draft_step == pytest.approx(9.0 / 30.0) and p.draft_cv == {1: 1.0, 2: 1.2}
    alone = load_profile(str(tmp_path / "t.json"))
    assert alone.draft_step is None and alone.draft_cv is None      # the recordings' draft prices stay
    with pytest.raises(ValueError, match="unknown profile 'zen9'"):
        load_profile("zen9")
    with pytest.raises(ValueError, match="no 'cv' table"):
        measured_profile({"ms": {"1": 3.0}})
    with pytest.raises(ValueError, match="measured --profile"):
        load_profile("dear-verify", tmp_path / "d.json")
    with pytest.raises(ValueError, match="target steps"):
        Profile("x", {1: 1.0}, draft_step=30.0)


def test_categories_come_from_the_recording_names():
    assert category_of("code_edit-9") == "code_edit" and category_of("multi_turn-65") == "multi_turn"
    assert category_of("free_form") == "free_form" and category_of("a-b") == "a-b"


def test_the_command_replays_a_file_under_profiles(tmp_path, capsys):
    recs = synthetic_suite(seeds=(0,), n=60)
    f = tmp_path / "r.json"
    f.write_text(json.dumps({n: asdict(r) for n, r in recs.items()}))
    assert main(["--replay", str(f), "--profile", "cheap-verify,dear-verify", "--profile", "dear-draft"]) == 0
    text = capsys.readouterr().out
    assert text.count("auto >= 0.97x greedy in every category:") == 3
    assert "profile dear-verify: c_v {1:1.00 2:1.60" in text and "chatter" in text
    assert "under every profile: HOLDS" in text


def test_a_real_recording_holds_greedy_under_every_profile():
    """A real recording (benchmarks/data: the 1.5B's greedy answer to the suite's question 67, 192 tokens, and
    the 0.5B's teacher-forced guesses over it, recorded with `--suite 4 --gen 192`, with this machine's
    measured costs). Before the controller priced its probes and plans by the costs, `auto` ran at 0.94x
    greedy on it under dear-verify."""
    recs = load_recordings(DATA / "auto_replay_multi_turn.json")
    for name in ("recorded", *sorted(PROFILES)):
        priced = recs if name == "recorded" else {n: PROFILES[name].apply(r) for n, r in recs.items()}
        cats = tally(priced, replay_all(priced, MODES))
        t = cats["multi_turn"]
        assert t.lossless and t.speedup("auto") >= AUTO_FLOOR, (name, t.speedup("auto"))
        assert t.gap() > -0.05, (name, {m: round(t.speedup(m), 3) for m in MODES})


CV = {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.5, 9: 2.2, 17: 3.5}
LOOPING = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4]   # a prompt that repeats itself


def test_the_auto_replay_makes_the_engines_rounds():
    """benchmarks/auto_replay.py's prompt-lookup replay, priced as the engine's costs, on the engine's run."""
    model, args = tiny_model("qwen2", backend="fp32-rows", vocab=16)
    costs = Costs(cv=CvCurve.measured(CV), draft_cost={"ngram": 0.0}, round_overhead=0.02)
    eng = Engine(model, KVCache(args, 160, extra=MAX_K + 1), offered({"ngram": lambda req: NgramDrafter(req.ngram)}),
                 eos_ids=[], max_seq=160, costs=costs)
    *live, done = eng.generate(GenerationRequest(prompt_ids=LOOPING, max_new_tokens=60, spec="ngram", k=6))
    rec = Recording(prompt=LOOPING, out=done.ids, guess=done.ids, sure=[1.0] * 60, target_cv=CV, round_overhead=0.02)
    res = replay(rec, "ngram", k_max=6)
    by: dict[str, int] = {}
    for r in live:
        name = r.drafter if r.drafted else "none"
        by[name] = by.get(name, 0) + 1
    assert res.lossless and res.rounds == len(live) and res.by_drafter == by
    step = sum(costs.cv(1 + r.drafted) + 0.02 if r.drafted else 1.0 for r in live)
    assert res.cost == pytest.approx(step)

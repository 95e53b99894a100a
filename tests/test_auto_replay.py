"""The offline replay of the speculative modes (bench/auto_replay.py) on hand-made recordings."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from speczoo.bench.auto_replay import EagleReplay, Recording, RecordedDraft, load_recordings, replay
from speczoo.cache import KVCache
from speczoo.events import GenerationRequest
from speczoo.spec.drafters.eagle import TreeShape, make_eagle_drafter
from speczoo.spec.engine import MAX_K, Engine
from speczoo.spec.reference import IdTokenizer
from test_eagle_drafter import PROMPT, trained  # noqa: F401  (a tiny target and a head trained on it)

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

FLAT = {1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0, 9: 1.0, 17: 1.0}


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
def test_the_eagle_replay_makes_the_engines_rounds(trained, tree):  # noqa: F811 (the imported fixture)
    """At the engine's default prices (c_v 1, free drafts) the replay of an EAGLE head chooses, drafts
    and accepts round for round what the real engine does on the tiny target."""
    model, args, head = trained
    name = "eagle" if tree is None else "eagle-tree"
    factory = make_eagle_drafter(head, 128, tree)
    eng = Engine(model, KVCache(args, 128, extra=MAX_K + 1), IdTokenizer(), {name: factory}, eos_ids=[],
                 max_seq=128)
    *events, done = eng.generate(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=40, spec=name, k=6))
    live = [(e.drafter, e.accepted) for e in events if e.ids]
    ids = PROMPT + done.ids
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), KVCache(args, len(ids) + 1),
                       hidden_layers=head.cfg.target_layers).hidden
    rec = recording(done.ids, done.ids, prompt=PROMPT, draft_step=0.0)
    eagle = EagleReplay(head=head, step=0.0, tree=tree or TreeShape(), features=hidden)
    spy: list[tuple[str, int]] = []
    res = replay(rec, name, k_max=6, eagle=eagle, controller=spying(spy))
    assert spy == live[:len(spy)] and len(spy) == len(live) - (live[-1][0] == "none")
    assert res.by_drafter.get(name, 0) >= len(live) - 2


def spying(log: list):
    """A Controller that logs (drafter, accepted) per drafted round, as the engine's events report it."""
    from speczoo.spec.controller import Controller

    class Spy(Controller):
        def update(self, drafter, drafted, accepted):
            log.append((drafter, accepted))
            super().update(drafter, drafted, accepted)
    return Spy


def test_the_recorded_draft_guesses_as_the_real_one():
    """On a text that repeats, the draft's prompt-lookup guesses (spec/drafters/guess.py) give the same
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

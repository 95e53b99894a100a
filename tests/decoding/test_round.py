"""One round driver (decoding/round.py) for the engine and the replays, and text above the engine.

The replays verify against a recorded greedy output instead of a target forward; everything else in
their rounds is the engine's code, so on the engine's own recorded run they must make the engine's
rounds: the same drafter, the same draft, the same accepted count, round for round. The engine emits
ids only; the runtime layer (textgen.py) adds the text, UTF-8-safe and cut at stop strings.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny import tiny_model
from tiny_gguf import write_tiny_gguf

from speczoo.cache import KVCache
from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.drafters.base import FeatureTaps
from speczoo.decoding.drafters.eagle import TreeShape, make_eagle_drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.drafters.registry import DRAFT, DrafterSpec
from speczoo.decoding.eagle_replay import Always, replay as eagle_replay
from speczoo.decoding.engine import Engine
from speczoo.models.forward import Readout
from speczoo.decoding.policy import make_policy
from reference import OracleModel, TokenCache
from speczoo.decoding.round import Finished, Generation, Round, run_round, verify_recorded
from speczoo.decoding.types import MAX_K
from speczoo.textgen import generate_text
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from tiny_eagle import PROMPT
from offered import offered

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

DRAFTERS = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
            "ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
CV = {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.5, 9: 2.2, 17: 3.5}
LOOPING = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4]   # a prompt that repeats itself


def engine_rounds(eng: Engine, req: GenerationRequest) -> tuple[list[Round], Finished]:
    *rounds, done = eng.generate(req)
    assert all(isinstance(r, Round) for r in rounds) and isinstance(done, Finished)
    return rounds, done


def recorded_rounds(req: GenerationRequest, out: list[int], costs: Costs | None) -> list[Round]:
    """The request's rounds replayed: its drafters and policy as the engine builds them, verified
    against the engine's output `out`."""
    names = list(DRAFTERS) if req.spec == "auto" else [req.spec]
    drafters = {n: DRAFTERS[n](req) for n in names}
    g = Generation(drafters, make_policy(req, drafters, costs), list(req.prompt_ids), req.max_new_tokens)
    g.start(out[0])
    rounds = []
    while g.finish is None:
        rounds.append(run_round(g, lambda g, p: verify_recorded(p, out, len(g.out))))
    return rounds


@pytest.mark.parametrize("spec", ["ngram", "ngram-tree", "auto"])
@pytest.mark.parametrize("costs", [None, Costs(cv=CvCurve.measured(CV), draft_cost={"ngram": 0.0, "ngram-tree": 0.0},
                                               round_overhead=0.02)], ids=["free", "priced"])
def test_a_replay_makes_the_engines_rounds_on_a_tiny_model(spec, costs):
    model, args = tiny_model("qwen2", backend="fp32-rows", vocab=16)
    eng = Engine(model, KVCache(args, 160, extra=MAX_K + 1), offered(DRAFTERS), eos_ids=[], max_seq=160, costs=costs)
    req = GenerationRequest(prompt_ids=LOOPING, max_new_tokens=60, spec=spec, k=6)
    live, done = engine_rounds(eng, req)
    assert sum((r.ids for r in live), []) == done.ids and done.finish_reason == "length"
    assert sum(r.accepted for r in live) > 5                       # the drafts were exercised
    assert unseen_last(recorded_rounds(req, done.ids, costs)) == unseen_last(live)


def unseen_last(rounds: list[Round]) -> list[Round]:
    """The rounds without the last one's pending token: a recording ends before it."""
    return rounds[:-1] + [replace(rounds[-1], pending=-1)]


@pytest.mark.parametrize("tree", [None, TreeShape(depth=3, branch=2)], ids=["chain", "tree"])
def test_the_eagle_replay_makes_the_engines_rounds(trained, tree):  # trained: tests/conftest.py
    """decoding/eagle_replay.py against the engine's rounds under the same always-draft policy."""
    model, args, head = trained
    k = 6 if tree is None else 12
    eng = Engine(model, KVCache(args, 128, extra=MAX_K + 1), [], eos_ids=[], max_seq=128)
    drafter = make_eagle_drafter(head, 128, tree)(GenerationRequest(prompt_ids=PROMPT))
    g = Generation({drafter.name: drafter}, Always(drafter.name, k), list(PROMPT), 40, taps=FeatureTaps([drafter]))
    for _ in eng.rounds(g):
        pass
    ids = PROMPT + g.out
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), KVCache(args, len(ids) + 1),
                       readout=Readout(hidden_layers=head.cfg.target_layers)).hidden
    res = eagle_replay(head, ids, hidden, len(PROMPT), k, tree)
    assert (res.rounds, res.drafted, res.accepted) == (g.stats.rounds, g.stats.drafted, g.stats.accepted)
    assert res.accepted > 5


# -- text above the engine ----------------------------------------------------------------------------

class ScriptOracle:
    """Says `script` after the prompt, token by token (what a model that has learnt it would say)."""

    def __init__(self, vocab: int, prompt: int, script: list[int]):
        self.vocab, self.prompt, self.script = vocab, prompt, script

    def logits(self, ctx: list[int]) -> torch.Tensor:  # -> [V]
        out = torch.zeros(self.vocab)
        out[self.script[(len(ctx) - self.prompt) % len(self.script)]] = 1.0
        return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "q.gguf", "qwen2")
    return read_tokenizer(path)


def text_engine(tok: Tokenizer, text: str) -> tuple[Engine, list[int]]:
    script = tok.encode(text)
    oracle = ScriptOracle(tok.vocab_size, len(script[:6]), script[6:] + script)
    eng = Engine(OracleModel(oracle), TokenCache(400), offered({"ngram": DRAFTERS["ngram"]}), eos_ids=tok.eos_ids,
                 max_seq=300)
    return eng, script[:6]


TEXT = "hello wörld 😀 the end. " * 4


@pytest.mark.parametrize("spec", ["off", "ngram"])
def test_the_engine_emits_ids_and_the_runtime_adds_their_text(tok, spec):
    eng, prompt = text_engine(tok, TEXT)
    req = GenerationRequest(prompt_ids=prompt, max_new_tokens=70, spec=spec, k=4)
    rounds, finished = engine_rounds(eng, req)
    assert not any(hasattr(r, "text") for r in rounds) and not hasattr(finished, "text")
    *events, done = generate_text(eng, tok, req)
    assert all(isinstance(e, TokenEvent) for e in events) and isinstance(done, DoneEvent)
    assert [(e.ids, e.drafted, e.accepted, e.drafter) for e in events if e.ids] == \
        [(r.ids, r.drafted, r.accepted, r.drafter) for r in rounds]
    assert (done.ids, done.finish_reason) == (finished.ids, finished.finish_reason)
    assert "".join(e.text for e in events) == done.text == tok.decode(done.ids)
    assert all("\ufffd" not in e.text for e in events)
    # a character split across rounds waits for its last byte: some round ends mid-character
    assert any(e.ids and not e.text for e in events) or spec == "ngram"


def test_a_stop_string_ends_the_text_but_not_the_round_that_found_it(tok):
    """A stop string ends the generation as it always has: "stop", the text cut before it, and the ids
    every round emitted (the whole last round's run included)."""
    eng, prompt = text_engine(tok, TEXT)
    req = GenerationRequest(prompt_ids=prompt, max_new_tokens=70, spec="ngram", k=8, stop=["the end. hello"])
    *events, done = generate_text(eng, tok, req)
    full = tok.decode(done.ids)
    assert done.finish_reason == "stop" and done.text == full[:full.index("the end. hello")]
    assert "".join(e.text for e in events) == done.text
    assert done.ids == sum((e.ids for e in events), []) and done.stats.new_tokens == len(done.ids)
    assert tok.decode(done.ids) != done.text                       # the last round ran past the stop string
    assert len(done.ids) < 70


def test_a_character_unfinished_at_the_end_shows_as_a_replacement(tok):
    eng, prompt = text_engine(tok, "ab 😀 cd 😀 " * 3)
    n = next(i for i in range(1, 30) if "\ufffd" in tok.decode(tok.encode("ab 😀 cd 😀 " * 3)[6:6 + i]))
    *events, done = generate_text(eng, tok, GenerationRequest(prompt_ids=prompt, max_new_tokens=n))
    assert done.text.endswith("\ufffd") and "".join(e.text for e in events) == done.text
    assert all("\ufffd" not in e.text for e in events[:-1])         # only the flush at the end shows it


def test_offering_a_drafter_makes_a_new_engine_and_changes_nothing_under_anyone():
    costs = Costs(cv=CvCurve.measured(CV), draft_cost={"ngram": 0.0}, round_overhead=0.02)
    eng = Engine(OracleModel(ScriptOracle(16, 4, [1, 2, 3])), TokenCache(100), offered({"ngram": DRAFTERS["ngram"]}),
                 eos_ids=[], max_seq=60, costs=costs)
    more = eng.offer(DrafterSpec("tree", DRAFTERS["ngram-tree"], cost=0.25, auto=False))
    assert list(eng.drafters) == ["ngram"] and eng.costs.draft_cost == costs.draft_cost == {"ngram": 0.0}
    assert more.costs.draft_cost["tree"] == 0.25 and more._drafter_names("auto") == ["ngram"]
    *_, done = more.generate(GenerationRequest(prompt_ids=[1, 2, 3, 1], max_new_tokens=20, spec="tree", k=4))
    assert done.ids == [1, 2, 3] * 6 + [1, 2] and done.stats.accepted > 0
    with pytest.raises(ValueError, match="no cost profile"):
        Engine(OracleModel(ScriptOracle(16, 4, [1])), TokenCache(100), [], [], 60).offer(
            DrafterSpec("x", DRAFTERS["ngram"], cost=0.5))
    with pytest.raises(ValueError, match="no factory"):              # a drafter not bound to what a runtime loaded
        Engine(OracleModel(ScriptOracle(16, 4, [1])), TokenCache(100), [DRAFT], [], 60)

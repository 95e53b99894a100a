"""One descriptor per drafter (decoding/drafters/registry.py): the built-ins' facts, binding to what a
runtime loaded, and the engine reading them: `auto`'s choices, a named draft model that is not the one
loaded, a descriptor with nothing to draft with."""

from types import SimpleNamespace

import pytest
import torch

from offered import offered
from oracle_engines import generate
from reference import HashOracle, OracleModel, TokenCache
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.registry import (BUILTIN, BY_NAME, DRAFT, DRAFT_MODEL, EAGLE, EAGLE_HEAD, NGRAM,
                                                NGRAM_TREE, Bound, DrafterSpec)
from speczoo.decoding.engine import Engine
from speczoo.decoding.pricing.cost import Costs


def test_the_builtin_descriptors_say_each_fact_once():
    assert [s.name for s in BUILTIN] == ["ngram", "ngram-tree", "suffix", "draft", "eagle", "eagle-tree"]
    # prompt lookup's tree is priced by its own trees (controller `trees`); EAGLE's tree only by name
    assert [s.name for s in BUILTIN if s.auto] == ["ngram", "ngram-tree", "suffix", "draft", "eagle"]
    assert [s.name for s in BUILTIN if s.by_name_in_batch] == ["ngram", "ngram-tree", "suffix"]
    assert [s.name for s in BUILTIN if s.leased] == ["draft"]                      # lent to one sequence
    assert {s.name: s.takes_name for s in BUILTIN if s.takes_name} == {
        "draft": DRAFT_MODEL, "eagle": EAGLE_HEAD, "eagle-tree": EAGLE_HEAD}
    assert NGRAM.cost == NGRAM_TREE.cost == 0.0 and DRAFT.factory is None and DRAFT.cost is None
    with pytest.raises(TypeError):
        BY_NAME["ngram"] = NGRAM                                                    # read-only
    with pytest.raises(AttributeError):
        NGRAM.auto = False                                                          # frozen


def loaded(draft=None, draft_costs=None, eagle=None):
    return SimpleNamespace(target=None, draft=draft, draft_costs=draft_costs, eagle=eagle, max_seq=64,
                           kv_dtype=torch.float16)


def test_binding_takes_what_the_runtime_loaded_or_offers_nothing():
    assert NGRAM.bound(loaded()) is NGRAM                                           # needs nothing loaded
    assert DRAFT.bound(loaded()) is None and EAGLE.bound(loaded()) is None          # nothing to draft with
    factory = object()
    spec = DrafterSpec("mine", load=lambda got: Bound(factory, got.max_seq / 128, ("m1", "m")))
    bound = spec.bound(loaded())
    assert (bound.factory, bound.cost, bound.names) == (factory, 0.5, ("m1", "m")) and spec.factory is None


def test_a_descriptor_must_be_bound_and_named_plainly():
    with pytest.raises(ValueError, match="no factory"):
        Engine(OracleModel(HashOracle(8, seed=1)), TokenCache(64), [DRAFT], [], 32)
    for bad in ("auto", "off", "a:b", ""):
        with pytest.raises(ValueError, match="plain mode name"):
            DrafterSpec(bad)
    with pytest.raises(ValueError, match="unique"):
        Engine(OracleModel(HashOracle(8, seed=1)), TokenCache(64), [NGRAM, NGRAM], [], 32)


def test_auto_picks_what_the_descriptors_allow_and_a_named_draft_must_be_the_loaded_one():
    oracle = HashOracle(8, seed=2)
    lookup = lambda req: NgramDrafter(req.ngram)                                   # noqa: E731
    draft = DrafterSpec("draft", lookup, cost=0.25, batchable=True, shared_cache=True, takes_name=DRAFT_MODEL,
                        names=("small",))
    tree = DrafterSpec("ngram-tree", lookup, cost=0.0, auto=False)
    eng = Engine(OracleModel(oracle), TokenCache(200), [*offered({"ngram": lookup}), draft, tree], [], 100,
                 costs=Costs(cv=1.0, draft_cost={"ngram": 0.0}))
    assert eng._drafter_names("auto") == ["ngram", "draft"]
    assert eng.costs.draft_cost == {"ngram": 0.0, "draft": 0.25, "ngram-tree": 0.0}
    plain = generate(eng, prompt_ids=[1, 2, 3, 1, 2], max_new_tokens=12)
    assert generate(eng, prompt_ids=[1, 2, 3, 1, 2], max_new_tokens=12, spec="draft:small").ids == plain.ids
    with pytest.raises(ValueError, match="names a draft model 'big'.*drafts with small"):
        generate(eng, prompt_ids=[1, 2, 3], max_new_tokens=4, spec="draft:big")
    with pytest.raises(ValueError, match="takes no name"):
        generate(eng, prompt_ids=[1, 2, 3], max_new_tokens=4, spec="ngram-tree:x")

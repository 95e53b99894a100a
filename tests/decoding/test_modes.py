"""The one parser of speculative modes (decoding/modes.py)."""

import pytest

from speczoo.decoding.drafters.registry import BUILTIN, NGRAM, DrafterSpec
from speczoo.decoding.modes import MODES, SpecMode


def test_every_mode_parses_and_prints_back():
    for text in [*MODES, "draft:qwen2.5-coder-0.5b", "eagle:my-head", "eagle-tree:/tmp/head"]:
        assert str(SpecMode.parse(text)) == text


def test_names_go_to_the_draft_model_or_the_head():
    assert SpecMode.parse("draft:small").draft_model == "small"
    assert SpecMode.parse("draft:small").eagle_head is None
    assert SpecMode.parse("eagle:h").eagle_head == "h" and SpecMode.parse("eagle-tree:h").eagle_head == "h"
    assert SpecMode.parse("eagle").eagle_head is None and SpecMode.parse("auto").draft_model is None
    assert SpecMode.parse("draft:small").mode == "draft"


@pytest.mark.parametrize("text, message", [
    ("warp", "unknown speculative mode 'warp': choose one of off, ngram, ngram-tree, suffix, draft, eagle"),
    ("ngram:x", "takes no name"), ("off:x", "takes no name"), ("draft:", "names nothing"), ("", "unknown")])
def test_a_bad_mode_is_an_error_listing_the_choices(text, message):
    with pytest.raises(ValueError, match=message):
        SpecMode.parse(text)


def test_offered_drafters_are_the_choices_of_a_loaded_engine():
    assert SpecMode.parse("tree", offered={"tree": DrafterSpec("tree")}).mode == "tree"
    with pytest.raises(ValueError, match="'draft' is not available here; choose one of off, ngram, auto$"):
        SpecMode.parse("draft", offered={"ngram": NGRAM})
    with pytest.raises(ValueError, match="takes no name"):                 # the offered descriptor says
        SpecMode.parse("tree:x", offered={"tree": DrafterSpec("tree")})


def test_the_modes_are_the_descriptors_names_in_order():
    assert MODES == ("off", *(s.name for s in BUILTIN), "auto")
    assert [s.name for s in BUILTIN if s.takes_name] == ["draft", "eagle", "eagle-tree"]

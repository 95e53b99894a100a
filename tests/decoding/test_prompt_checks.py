"""The one context-length check and the one vocabulary check (decoding/prompt_checks.py)."""

import pytest

from speczoo.decoding.prompt_checks import check_fits, check_ids, fits
from speczoo.errors import CacheFullError


def test_a_prompt_fits_when_it_leaves_room_for_what_it_asks():
    assert fits(3, 5, 8) and not fits(3, 6, 8) and not fits(8, 0, 8) and not fits(9, 1, 8)


def test_the_context_error_names_the_lengths_and_the_remedy():
    check_fits(3, 5, 8)
    with pytest.raises(CacheFullError, match=r"the prompt \(3 tokens\) plus max_tokens \(6\) exceeds the context "
                                             r"of 8 tokens: shorten the prompt, lower max_tokens, or restart"):
        check_fits(3, 6, 8, new_name="max_tokens", remedy="restart")


def test_an_id_outside_the_vocabulary_is_named():
    check_ids([0, 9], 10, "m")
    for ids, bad in (([1, 10, 2], 10), ([-1], -1)):
        with pytest.raises(ValueError, match=rf"prompt token id {bad} is outside the vocabulary of m \(0..9\)"):
            check_ids(ids, 10, "m")

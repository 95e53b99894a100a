"""The pair check refuses drafts that cannot draft for a target, and accepts a sound pair."""

from types import SimpleNamespace

import pytest

from speczoo.decoding.pair import PairError, check_pair
from tiny import tiny_model


class CharTok:
    """A toy tokenizer: one id per byte (offset), shared or shifted between models."""

    def __init__(self, shift=0, eos=(0,), bos=None):
        self.shift, self.eos_ids, self.bos_id = shift, list(eos), bos

    def encode(self, text, add_special=False):
        return [(b + self.shift) % 250 + 3 for b in text.encode()]

    def decode(self, ids):
        return "".join(chr(max(32, (i - 3 - self.shift) % 250)) for i in ids)


def loaded(model_args, tok=None):
    model, args = model_args
    return SimpleNamespace(model=model, args=args, tokenizer=tok or CharTok(), name="m")


def test_model_drafting_for_itself_passes():
    m = loaded(tiny_model("qwen2", vocab=256, seed=1))
    report = check_pair(m, m)
    assert report.ok, report.problems
    assert report.draft_first == report.target_first


def test_mismatched_vocabulary_and_tokenizer_are_refused():
    target = loaded(tiny_model("qwen2", vocab=256, seed=1))
    draft = loaded(tiny_model("qwen2", vocab=300, seed=1), CharTok(shift=7, eos=(1,)))
    report = check_pair(draft, target)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "vocabulary sizes differ" in text and "end-of-sequence" in text and "tokenizers disagree" in text
    with pytest.raises(PairError, match="cannot draft for"):
        report.raise_if_bad("draft", "target")


def test_a_draft_whose_first_tokens_disagree_is_refused():
    # untied heads: a tied tiny random model just echoes its last token, whatever its weights
    target = loaded(tiny_model("qwen2", vocab=256, seed=1, tie_embeddings=False))
    broken = loaded(tiny_model("qwen2", vocab=256, seed=2, tie_embeddings=False))   # other weights
    report = check_pair(broken, target)
    assert not report.ok
    assert "first-token gate" in report.problems[0]

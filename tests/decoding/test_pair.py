"""The pair check judges a draft by its tokenizer: it refuses drafts whose tokens, ids, specials or
pre-tokenizer differ, with the reason and the tokenizer the target needs, and accepts a sound pair, also
one whose embeddings differ only by padding rows, which then speculates losslessly."""

from types import SimpleNamespace

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.decoding.drafters.draft_model import make_draft_drafter
from speczoo.decoding.engine import Engine
from speczoo.decoding.pair import PairError, check_pair
from speczoo.decoding.types import MAX_K
from speczoo.models.loader import build_model
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.gguf_tokenizer import tokenizer_from_metadata
from offered import offered
from oracle_engines import generate
from tiny import greedy, tiny_args, tiny_model, tiny_tensors
from tiny_gguf import qwen_vocab, write_tiny_gguf

TEXT_IDS = len(qwen_vocab()[0])          # the ids text can produce with the tiny byte-level vocabulary


def tiny_tokenizer(pad_to=None, pre="qwen2", eos="<|im_end|>", swap=False) -> Tokenizer:
    """The tiny byte-level BPE vocabulary as a GGUF describes it: padded with "[PAD<id>]" tokens to pad_to
    ids, another pre-tokenizer, another end-of-sequence token, or two tokens' ids exchanged (swap)."""
    tokens, types, merges = qwen_vocab(pad_to)
    if swap:
        tokens[97], tokens[98] = tokens[98], tokens[97]     # 'a' and 'b'
    built = tokenizer_from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index(eos), "tokenizer.ggml.add_bos_token": False})
    return Tokenizer(built.tokenizer, built.config)


def loaded(model_args, tok=None, name="m"):
    model, args = model_args
    return SimpleNamespace(model=model, args=args, tokenizer=tok or tiny_tokenizer(args.vocab_size), name=name)


def test_model_drafting_for_itself_passes():
    m = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=1))
    report = check_pair(m, m)
    assert report.ok, report.problems
    assert report.draft_first == report.target_first and not report.padding


def test_mismatched_vocabulary_and_tokenizer_are_refused():
    target = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=1))
    draft = loaded(tiny_model("qwen2", vocab=TEXT_IDS + 1, seed=1), tiny_tokenizer(swap=True, eos="hello"))
    report = check_pair(draft, target)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "vocabulary sizes differ" in text and "end-of-sequence" in text and "tokenizers disagree" in text
    assert "tokens differ: id 97 is 'b' in the draft, 'a' in the target (2 of the first" in text
    with pytest.raises(PairError, match="cannot draft for") as err:
        report.raise_if_bad("draft", "target")
    # the refusal says which tokenizer the target needs
    assert "target needs a draft with its own tokenizer (qwen2 architecture, byte-level BPE of" in str(err.value)


def test_another_pre_tokenizer_or_real_tokens_past_the_shared_ids_are_refused():
    target = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=1))
    other_split = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=1), tiny_tokenizer(pre="llama-bpe"))
    assert check_pair(other_split, target).problems[0].startswith("pre-tokenizers differ")
    # the extra row of the draft holds a token text produces (a user-defined one), not padding
    tokens, types, merges = qwen_vocab()
    built = tokenizer_from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens + ["<tool>"],
        "tokenizer.ggml.token_type": types + [4], "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"), "tokenizer.ggml.add_bos_token": False})
    longer = loaded(tiny_model("qwen2", vocab=TEXT_IDS + 1, seed=1), Tokenizer(built.tokenizer, built.config))
    text = "\n".join(check_pair(longer, target).problems)
    assert f"text can produce ids 0..{TEXT_IDS:,} with the draft but 0..{TEXT_IDS - 1:,} with the target" in text


def test_a_draft_whose_first_tokens_disagree_is_refused():
    # untied heads: a tied tiny random model just echoes its last token, whatever its weights
    target = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=1, tie_embeddings=False))
    broken = loaded(tiny_model("qwen2", vocab=TEXT_IDS, seed=2, tie_embeddings=False))   # other weights
    report = check_pair(broken, target)
    assert not report.ok
    assert "first-token gate" in report.problems[0]
    assert "shares target's tokenizer but not its predictions" in report.advice("target")


def padded_pair(draft_rows: int, target_rows: int, loud: float = 0.0):
    """(draft, target): one untied tiny model over the tiny tokenizer, each with its own embedding rows
    past the TEXT_IDS real ones (padding, as Qwen2.5-0.5B's 151,936 and Qwen2.5-7B's 152,064). `loud`
    scales the LM head rows of the padding ids up so that a model picks them: the target then says ids
    the draft has no row for, and a draft would propose ids the target lacks, unless the drafter works in
    the target's ids."""
    models = []
    for rows in (draft_rows, target_rows):
        args = tiny_args("qwen2", vocab=max(draft_rows, target_rows), tie_embeddings=False)
        tensors = tiny_tensors(args, seed=3, tied=False)                    # the same weights for both
        tensors["output.weight"][TEXT_IDS:] *= loud
        for name in ("token_embd.weight", "output.weight"):
            tensors[name] = tensors[name][:rows].contiguous()
        args = tiny_args("qwen2", vocab=rows, tie_embeddings=False)
        models.append(loaded((build_model(args, tensors, "fp32"), args), tiny_tokenizer(rows)))
    return models


@pytest.mark.parametrize("draft_rows, target_rows", [(TEXT_IDS + 16, TEXT_IDS + 40), (TEXT_IDS + 40, TEXT_IDS)])
def test_a_pair_padded_past_one_tokenizer_is_accepted(draft_rows, target_rows):
    draft, target = padded_pair(draft_rows, target_rows)
    report = check_pair(draft, target)
    assert report.ok, report.problems
    assert report.padding == (f"the draft's {draft_rows:,} embedding rows and the target's {target_rows:,} differ "
                              f"only by padding (no text produces an id from {TEXT_IDS:,} up)")


@pytest.mark.parametrize("draft_rows, target_rows", [(TEXT_IDS, TEXT_IDS + 48), (TEXT_IDS + 48, TEXT_IDS + 16)])
def test_a_padded_pair_speculates_losslessly(draft_rows, target_rows):
    """Greedy spec output equals the target's greedy, token for token, though the target says padding ids
    the draft has no row for, or the draft's own padding rows would win its argmax; sampled, the draft's q
    is a distribution over the target's vocabulary and every id is one the target has."""
    draft, target = padded_pair(draft_rows, target_rows, loud=4.0)
    max_seq = 160
    factory = make_draft_drafter(draft, target, max_seq, head_vocab=None)
    eng = Engine(target.model, KVCache(target.args, max_seq, extra=MAX_K + 1), offered({"draft": factory}), [],
                 max_seq)
    prompt = [104, 101, 108, 108, 111, 32, 119, 111]
    want = greedy(target.model, target.args, torch.tensor(prompt), 48)
    assert any(i >= min(draft_rows, target_rows) for i in want) == (target_rows > draft_rows)
    done = generate(eng, prompt_ids=prompt, max_new_tokens=48, spec="draft", k=4)
    assert done.ids == want
    assert done.stats.drafted > 0
    sampled = generate(eng, prompt_ids=prompt, max_new_tokens=48, spec="draft", k=4,
                       sampling=SamplingParams(temperature=1.0, seed=5))
    assert len(sampled.ids) == 48 and max(sampled.ids) < target_rows
    proposals = factory(GenerationRequest(prompt_ids=prompt, max_new_tokens=8)).propose(prompt, 8).tokens
    assert max(proposals) < target_rows


def test_a_draft_given_as_a_gguf_path_is_pulled_and_drafts(tmp_path, monkeypatch, capsys):
    """`--draft PATH` (and the target's PATH) of GGUF files not pulled yet: both are pulled on first use,
    the padded pair is accepted, and the speculative output is the plain one."""
    from speczoo.cli import main

    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    target, _ = write_tiny_gguf(tmp_path / "target.gguf", "qwen2", pad_to=TEXT_IDS + 32)
    draft, _ = write_tiny_gguf(tmp_path / "draft.gguf", "qwen2")
    common = ["--prompt", "hello world", "-n", "12", "--max-seq", "64", "--backend", "fp32"]
    assert main(["generate", str(target), "--draft", str(draft), "--spec", "draft", "--stats", *common]) == 0
    out = capsys.readouterr()
    for path in (target, draft):
        assert f"speczoo: {path} is not pulled yet; pulling it now, as `speczoo pull {path}` does" in out.err
    assert "accepted/round" in out.err
    assert main(["generate", str(target), *common]) == 0
    plain = capsys.readouterr()
    assert "pulling" not in plain.err and plain.out == out.out
    assert main(["check-pair", str(draft), str(target), "--backend", "fp32"]) == 0
    assert "differ only by padding" in capsys.readouterr().out


@pytest.mark.real
def test_real_pairs_are_judged_by_their_tokenizers(session_home, capsys):
    """A Qwen model drafts for a Qwen target (the 0.5b for itself: CI pulls no larger Qwen); SmolLM2's
    tokenizer is refused for a Qwen target, with the reasons and the tokenizer the target needs."""
    from speczoo.cli import main

    assert main(["check-pair", "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"]) == 0
    assert "PAIR OK" in capsys.readouterr().out
    assert main(["check-pair", "smollm2-135m", "qwen2.5-coder-0.5b"]) == 1
    out = capsys.readouterr().out
    for reason in ("pre-tokenizers differ", "tokens differ: id 0 is '<|endoftext|>' (special) in the draft, '!' in",
                   "vocabulary sizes differ: draft 49,152, target 151,936",
                   "qwen2.5-coder-0.5b needs a draft with its own tokenizer (qwen2 architecture, byte-level BPE of "
                   "151,665 tokens"):
        assert reason in out

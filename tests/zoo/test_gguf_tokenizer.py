"""How speczoo reads a GGUF vocabulary, rule by rule as llama.cpp reads it: the pre-tokenizer table, BOS/EOS
defaults per tokenizer, end-of-generation and control tokens by text, SentencePiece's space prefix,
Phi-3's right-stripped specials, and the fast metadata reader. Hand-made metadata, no model files.
(That the ids equal llama.cpp's on its own vocabulary tests is tests/zoo/test_tokenizer_llama.py's.)
"""

from __future__ import annotations

import gguf
import pytest
from tiny_gguf import gemma_vocab, qwen_vocab, write_tiny_gguf

from speczoo.zoo.gguf_metadata import read_gguf_metadata
from speczoo.zoo.gguf_tokenizer import tokenizer_from_metadata
from speczoo.zoo.pretokenizers import PRE_TOKENIZERS, SPLITS

TEXT = "Hello wörld 1234567 日本語 😀 def f(x):\n\treturn x  # I'm DONE\r\n"


def byte_level(pre: str | None = "qwen2", extra: tuple[tuple[str, int], ...] = (), **keys) -> dict:
    """Metadata of a small byte-level vocabulary (tests/tiny_gguf.py's qwen one) plus `extra` (text, type) tokens."""
    tokens, types, merges = qwen_vocab()
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens + [t for t, _ in extra],
            "tokenizer.ggml.token_type": types + [ty for _, ty in extra], "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>")}
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    return {**meta, **keys}


def sentencepiece(**keys) -> dict:
    tokens, types, scores = gemma_vocab()
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.unknown_token_id": 3, **keys}


def encode(meta: dict, text: str, add_special: bool = False) -> list[int]:
    return tokenizer_from_metadata(meta).tokenizer.encode(text, add_special_tokens=add_special).ids


# ---------------------------------------------------------------- the pre-tokenizer table

@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_name_builds_and_round_trips(name):
    """Each regex of the table compiles in tokenizers' engine and splits without losing a byte."""
    tok = tokenizer_from_metadata(byte_level(name)).tokenizer
    assert tok.decode(tok.encode(TEXT, add_special_tokens=False).ids) == TEXT


def test_the_table_has_no_dead_entries():
    assert {p.splits for p in PRE_TOKENIZERS.values()} == set(SPLITS)


def test_digits_split_as_each_type_says():
    words = {name: [w for w, _ in tokenizer_from_metadata(byte_level(name)).tokenizer.pre_tokenizer
                    .pre_tokenize_str("x 1234567")] for name in ("qwen2", "llama-bpe", "gpt-2", "smollm")}
    assert words["qwen2"] == ["x", "Ġ", *"1234567"]                  # one digit at a time
    assert words["llama-bpe"] == ["x", "Ġ", "123", "456", "7"]       # up to three digits
    assert words["gpt-2"] == ["x", "Ġ1234567"]                       # a space and every digit
    assert words["smollm"] == ["x", "Ġ", *"1234567"]                 # digits isolated first


def test_an_unknown_pre_tokenizer_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"'kimi-k2' is not supported; speczoo knows \[.*'llama-bpe'.*'smollm'"):
        tokenizer_from_metadata(byte_level("kimi-k2"))


def test_an_unknown_tokenizer_model_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"'bert' is not supported; speczoo reads \['gemma4', 'gpt2', 'llama'\]"):
        tokenizer_from_metadata({**byte_level(), "tokenizer.ggml.model": "bert"})


def test_a_missing_pre_tokenizer_splits_as_llama_cpps_default_and_says_so():
    built = tokenizer_from_metadata(byte_level(None))
    assert len(built.warnings) == 1 and "'default'" in built.warnings[0] and "re-convert" in built.warnings[0]


# ---------------------------------------------------------------- BOS / EOS

@pytest.mark.parametrize("meta, add_bos", [
    (byte_level("llama-bpe"), True),                    # Llama 3: BOS unless the file says otherwise
    (byte_level("llama-bpe", **{"tokenizer.ggml.add_bos_token": False}), False),
    (byte_level("tekken"), True),                       # Mistral's tekken
    (byte_level("qwen2"), False),
    (byte_level("smollm"), False),
    (byte_level("qwen2", **{"tokenizer.ggml.add_bos_token": True}), True),
    (sentencepiece(), True),                             # SentencePiece: BOS by default
    (sentencepiece(**{"tokenizer.ggml.add_bos_token": False}), False),
])
def test_bos_is_added_as_llama_cpp_adds_it(meta, add_bos):
    built = tokenizer_from_metadata(meta)
    bos = meta["tokenizer.ggml.bos_token_id"]
    assert built.config["add_bos_token"] is add_bos
    assert encode(meta, "hello", add_special=True) == [bos] * add_bos + encode(meta, "hello")


def test_eos_is_appended_when_the_file_asks():
    meta = byte_level("qwen2", **{"tokenizer.ggml.add_eos_token": True})
    assert encode(meta, "hello", add_special=True) == [*encode(meta, "hello"), meta["tokenizer.ggml.eos_token_id"]]


def test_sentencepiece_defaults_name_bos_1_eos_2_unk_0():
    tokens, types, scores = gemma_vocab()
    built = tokenizer_from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                     "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores})
    assert built.config["bos_id"] == 1 and built.config["eos_ids"][0] == 2 and built.config["unk_token"] == tokens[0]


# ---------------------------------------------------------------- end of generation, control by text

def test_end_of_generation_tokens_are_found_by_text_as_llama_cpp_finds_them():
    extra = (("<|eot_id|>", 1), ("<|fim_prefix|>", 1), ("<|fim_pad|>", 3), ("<|file_sep|>", 1), ("<|end|>", 3),
             ("</s>", 1), ("<think>", 4))
    meta = byte_level("qwen2", extra=extra, **{"tokenizer.ggml.eot_token_id": 200})
    built = tokenizer_from_metadata(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    names = [tokens[i] for i in built.config["eos_ids"]]
    assert names[0] == "<|im_end|>" and names[1] == tokens[200]          # the file's eos, then its eot id
    assert set(names[2:]) == {"<|endoftext|>", "<|eot_id|>", "<|fim_pad|>", "<|file_sep|>", "<|end|>", "</s>"}
    # a control-looking token typed NORMAL is special all the same; a FIM prefix is special but no end
    special = {t.content for t in built.tokenizer.get_added_tokens_decoder().values() if t.special}
    assert {"<|eot_id|>", "<|fim_prefix|>", "</s>"} <= special and "<think>" not in special
    assert encode(meta, "a<think>b").count(tokens.index("<think>")) == 1            # user-defined: whole


@pytest.mark.parametrize("markers, dropped", [(("<|return|>", "<|call|>"), "<|end|>"),
                                              (("<|tool_response>",), "</s>")])
def test_llama_cpps_two_exceptions_to_the_end_texts(markers, dropped):
    extra = tuple((m, 3) for m in markers) + (("<|end|>", 3), ("</s>", 3))
    built = tokenizer_from_metadata(byte_level("qwen2", extra=extra))
    tokens = byte_level("qwen2", extra=extra)["tokenizer.ggml.tokens"]
    names = {tokens[i] for i in built.config["eos_ids"]}
    assert dropped not in names and ({"<|end|>", "</s>"} - {dropped}) <= names


def test_an_out_of_range_special_id_is_dropped_with_a_note():
    built = tokenizer_from_metadata(byte_level("qwen2", **{"tokenizer.ggml.bos_token_id": 10**6}))
    assert built.config["bos_id"] is None and "outside" in built.warnings[0]


# ---------------------------------------------------------------- SentencePiece

def test_sentencepiece_prefixes_a_space_to_each_run_after_a_special():
    """llama.cpp puts "▁" before the text and after every special token (add_space_prefix, on by default)."""
    tokens = gemma_vocab()[0]
    ids = encode(sentencepiece(), "hello<start_of_turn>hello")
    assert ids == [tokens.index("▁hello"), tokens.index("<start_of_turn>"), tokens.index("▁hello")]
    assert encode(sentencepiece(**{"tokenizer.ggml.add_space_prefix": False}), "hello") == [tokens.index("hello")]


@pytest.mark.parametrize("score_ab, score_bc, pieces", [(-1.0, -2.0, ["ab", "c"]), (-2.0, -1.0, ["a", "bc"])])
def test_sentencepiece_merges_follow_the_scores_not_the_token_order(score_ab, score_bc, pieces):
    """llama.cpp's SPM joins the pair that builds the best-scored token first, wherever it sits in the list."""
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc"]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type":
            [2, 3, 3, 1, 1, 1, 1, 1], "tokenizer.ggml.scores": [0.0] * 3 + [-10.0] * 3 + [score_ab, score_bc],
            "tokenizer.ggml.add_space_prefix": False}
    assert encode(meta, "abc") == [tokens.index(p) for p in pieces]


def test_characters_outside_the_vocabulary_fall_back_to_bytes():
    tokens = gemma_vocab()[0]
    assert encode(sentencepiece(**{"tokenizer.ggml.add_space_prefix": False}), "é") == [
        tokens.index("<0xC3>"), tokens.index("<0xA9>")]


def test_phi3_special_tokens_eat_the_whitespace_after_them():
    meta = byte_level("qwen2", extra=(("<|user|>", 4),), **{"general.name": "Phi3"})
    plain = byte_level("qwen2", extra=(("<|user|>", 4),), **{"general.name": "Qwen"})
    assert encode(meta, "<|user|>\n  hello") == encode(meta, "<|user|>hello")
    assert encode(plain, "<|user|>\n  hello") != encode(plain, "<|user|>hello")


# ---------------------------------------------------------------- the metadata reader

def test_metadata_reader_equals_gguf_readers(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "g.gguf", "gemma3")
    reader = gguf.GGUFReader(str(path))
    ours = read_gguf_metadata(path)
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours == expected


def test_metadata_reader_refuses_a_truncated_or_foreign_file(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated"):
        read_gguf_metadata(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_metadata(other)

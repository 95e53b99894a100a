"""Build a `tokenizers.Tokenizer` (and its tokenizer_config) from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: it stores llama.cpp's `tokenizer.ggml.*` keys (tokens, token types,
merges or scores, special ids). This module turns them into the same tokenizer transformers builds from
the file (the parity reference, checked by `zoo.tokparity`):

- `gpt2` (Qwen2): byte-level BPE with the merges from the file and the pre-tokenizer regex named by
  `tokenizer.ggml.pre`;
- `llama` on a Gemma architecture: SentencePiece-style BPE over "▁"-for-space text with byte fallback;
  the file has no merges, so they are derived from the vocabulary, ranked by token order.

It never guesses: an unknown tokenizer model or pre-tokenizer name is an error saying what is supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from speczoo.tokenizer import Tokenizer as SpeczooTokenizer
from speczoo.tokenizer import byte_alphabet
from speczoo.zoo.gguf_file import open_gguf

# llama.cpp token types (gguf.TokenType): which ids become added tokens.
CONTROL = int(gguf.TokenType.CONTROL)            # 3: special, matched whole, skipped by skip_special
USER_DEFINED = int(gguf.TokenType.USER_DEFINED)  # 4: matched whole, decoded as text

# Pre-tokenizer split regexes by `tokenizer.ggml.pre` (byte-level vocabularies only).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}

# Tokens that end a chat turn: generation stops on them as on eos.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")

SENTENCEPIECE_ARCHS = ("gemma", "gemma2", "gemma3")


@dataclass
class GGUFTokenizer:
    """What a bundle stores for its tokenizer: tokenizer.json, tokenizer_config.json, the chat template."""

    tokenizer: Tokenizer
    config: dict               # the content of tokenizer_config.json (see `tokenizer_config`)
    chat_template: str | None  # None: the GGUF has none (the registry may name one)


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


def _byte_level(tokens: list[str], types: list[int], merges: list[str], pre: str) -> Tokenizer:
    """Byte-level BPE (tokenizer.ggml.model == "gpt2")."""
    if pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; speczoo knows {sorted(PRE_TOKENIZER_SPLITS)}")
    alphabet = byte_alphabet()
    letters = set(alphabet.values())
    vocab = {}
    for i, tok in enumerate(tokens):
        # A token spelled outside the byte alphabet is written in it, byte by byte.
        key = tok if set(tok) <= letters else "".join(alphabet[b] for b in tok.encode("utf-8"))
        vocab[key] = i
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a mislabel in the file: it cannot be a real token.
    _add_special_tokens(tok, tokens, types, vocab, keep=lambda t: set(t) <= letters)
    return tok


def derive_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary, best first.

    Every split of a token into two tokens of the vocabulary is a merge. Merges rank by the position of
    the token they build (earlier is better), then by the longer left piece, then the longer right one;
    ties keep vocabulary order. This reproduces the order transformers derives for Gemma files, whose
    scores do not follow the merge order.
    """
    vocab = {t: i for i, t in enumerate(tokens)}   # a repeated token keeps its last id (as a dict does)
    ranked: list[tuple[int, int, int, str, str]] = []
    for t in dict.fromkeys(tokens):                # each distinct token once, in first-seen order
        local = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        ranked.extend((-vocab[t], len(left), len(right), left, right) for left, right in local)
    ranked.sort(key=lambda m: m[:3], reverse=True)  # stable: equal keys keep their order
    return [(m[3], m[4]) for m in ranked]


def _sentencepiece(arch: str, tokens: list[str], types: list[int], add_space_prefix: bool,
                   unk_token: str) -> Tokenizer:
    """Gemma's SentencePiece vocabulary as BPE with byte fallback (tokenizer.ggml.model == "llama")."""
    if arch not in SENTENCEPIECE_ARCHS:
        raise ValueError(f"a SentencePiece GGUF vocabulary is supported for {SENTENCEPIECE_ARCHS}, not {arch!r}")
    # Gemma files store a token of only spaces with real spaces; the model looks it up as "▁"s.
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    tok = Tokenizer(BPE(vocab=vocab, merges=derive_merges(spelled), unk_token=unk_token,
                        fuse_unk=True, byte_fallback=True))
    replace = normalizers.Replace(" ", "\u2581")
    tok.normalizer = (normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if add_space_prefix
                      else replace)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    # Added tokens keep the file's spelling: a spaces-only user-defined token is then not in the
    # vocabulary and stays a plain token sequence, as in the reference.
    _add_special_tokens(tok, tokens, types, vocab, keep=lambda t: True)
    return tok


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int], vocab: dict[str, int],
                        keep) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens (both matched whole)."""
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types, strict=True) if ty == CONTROL and keep(t)]
    tok.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED and t in vocab]
    tok.add_tokens(user)


def eos_ids_for(eos_id: int | None, token_ids: dict[str, int]) -> list[int]:
    """The file's eos id followed by every end-of-turn token the vocabulary has, without repeats."""
    ids = [] if eos_id is None else [eos_id]
    ids += [token_ids[t] for t in END_OF_TURN_TOKENS if t in token_ids]
    return list(dict.fromkeys(ids))


def tokenizer_config(tokens: list[str], bos_id: int | None, eos_ids: list[int], add_bos: bool,
                     byte_decoding: str, pad_id: int | None = None, unk_id: int | None = None) -> dict:
    """tokenizer_config.json: HF's key names for the special tokens plus speczoo's ids and decoding kind.

    byte_decoding tells the incremental decoder how a token id maps to bytes: "byte_level" (GPT-2
    alphabet) or "byte_fallback" ("▁" is a space, "<0xAB>" is one byte).
    """
    def name(i):
        return None if i is None else tokens[i]
    return {
        "add_bos_token": bool(add_bos),
        "bos_token": name(bos_id),
        "eos_token": name(eos_ids[0]) if eos_ids else None,
        "pad_token": name(pad_id),
        "unk_token": name(unk_id),
        "bos_id": bos_id,
        "eos_ids": list(eos_ids),
        "byte_decoding": byte_decoding,
    }


def tokenizer_from_gguf(reader: gguf.GGUFReader) -> GGUFTokenizer:
    """The tokenizer a GGUF file describes (slow for big vocabularies: ~10 s to read 262k tokens)."""
    arch = _field(reader, "general.architecture")
    kind = _field(reader, "tokenizer.ggml.model")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if tokens is None or kind is None:
        raise ValueError("the GGUF has no tokenizer (tokenizer.ggml.model / tokens missing); it cannot be used")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"the GGUF lists {len(tokens)} tokens but {len(types)} token types; the file is damaged")
    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    eos_id = _field(reader, "tokenizer.ggml.eos_token_id")
    unk_id = _field(reader, "tokenizer.ggml.unknown_token_id")
    pad_id = _field(reader, "tokenizer.ggml.padding_token_id")
    if kind == "gpt2":
        merges = _field(reader, "tokenizer.ggml.merges")
        if merges is None:
            raise ValueError("the GGUF's byte-level vocabulary has no tokenizer.ggml.merges; it cannot be used")
        tok = _byte_level(tokens, types, merges, _field(reader, "tokenizer.ggml.pre", "default"))
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
        decoding = "byte_level"
    elif kind == "llama":
        unk = tokens[unk_id] if unk_id is not None else "<unk>"
        tok = _sentencepiece(arch, tokens, types, bool(_field(reader, "tokenizer.ggml.add_space_prefix", False)),
                             unk)
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", True))
        decoding = "byte_fallback"
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; speczoo reads 'gpt2' and 'llama'")
    if add_bos:
        if bos_id is None:
            raise ValueError("the GGUF asks to add a BOS token but names no tokenizer.ggml.bos_token_id")
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    ids = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty == CONTROL}
    eos_ids = eos_ids_for(eos_id, ids)
    config = tokenizer_config(tokens, bos_id, eos_ids, add_bos, decoding, pad_id, unk_id)
    return GGUFTokenizer(tokenizer=tok, config=config, chat_template=_field(reader, "tokenizer.chat_template"))


def read_tokenizer(gguf_path: Path, chat_template: str | None = None) -> SpeczooTokenizer:
    """speczoo's Tokenizer built from a GGUF file's metadata, as a pull would store it (seconds for a large
    vocabulary); `chat_template` fills a missing one."""
    built = tokenizer_from_gguf(open_gguf(gguf_path))
    return SpeczooTokenizer(built.tokenizer, built.config, built.chat_template or chat_template)

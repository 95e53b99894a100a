"""Build a `tokenizers.Tokenizer` (and its tokenizer_config) from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: it stores llama.cpp's `tokenizer.ggml.*` keys (tokens, token types,
merges or scores, special ids, flags). This module turns them into a tokenizer whose ids equal
llama.cpp's for the same text (checked against llama.cpp's own vocabulary tests and `llama-tokenize`):

- `gpt2`: byte-level BPE with the file's merges (ranked by their order), the word-splitting regexes that
  llama.cpp uses for the file's `tokenizer.ggml.pre` (the table in `zoo.pretokenizers`), and whole-word
  lookup before merging where llama.cpp does it (Llama 3, Tekken);
- `llama` (SentencePiece: Llama 2, TinyLlama, Mistral v0.1-0.3, Phi-3, Gemma): llama.cpp's SPM
  tokenizer, which merges the pair that makes the highest-scored token first, as BPE whose merges are
  ranked by the file's scores; characters outside the vocabulary fall back to <0xAB> byte tokens; a
  space is prefixed to every text run after a special token when `add_space_prefix` (default on);
- `gemma4`: BPE with the file's merges over "▁"-escaped text split at newline runs, byte fallback.

Special tokens follow llama.cpp: CONTROL and UNKNOWN tokens (and every end-of-generation text, see
`zoo.gguf_specials`) are special, USER_DEFINED ones are matched whole and decoded as text, all as
spelled in the file. Unlike llama.cpp's vocabulary tests, speczoo always recognises special tokens in
text (llama.cpp's `parse_special`), since rendered chat templates carry them. BOS/EOS are added by the
file's `add_bos_token`/`add_eos_token`, else by llama.cpp's default for the tokenizer.

It never guesses: an unknown tokenizer model or pre-tokenizer name is an error saying what is supported.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from speczoo.tokenizer import Tokenizer as SpeczooTokenizer
from speczoo.zoo.gguf_metadata import read_gguf_metadata
from speczoo.zoo.gguf_specials import CONTROL, EOG_TEXTS, UNKNOWN, USER_DEFINED, control_texts, eog_texts, rstrips
from speczoo.zoo.pretokenizers import SPLITS, PreTokenizer, pre_tokenizer_for

# Tokens that end a chat turn, by text (an HF directory's tokenizer finds its stops with these too).
END_OF_TURN_TOKENS = EOG_TEXTS
SPACE = "\u2581"   # SentencePiece's visible space


@dataclass
class GGUFTokenizer:
    """What a bundle stores for its tokenizer: tokenizer.json, tokenizer_config.json, the chat template."""

    tokenizer: Tokenizer
    config: dict               # the content of tokenizer_config.json (see `tokenizer_config`)
    chat_template: str | None  # None: the GGUF has none (the registry may name one)
    warnings: list[str] = field(default_factory=list)  # what the caller should tell the user


class _ReaderMetadata:
    """A GGUFReader's metadata seen as a mapping (`get` only), read key by key as asked."""

    def __init__(self, reader: gguf.GGUFReader):
        self.reader = reader

    def get(self, key: str, default=None):
        f = self.reader.get_field(key)
        return default if f is None else f.contents()


@dataclass
class _Vocab:
    """A GGUF vocabulary as read: what each tokenizer model's builder needs."""

    meta: Mapping                # every metadata key -> value
    tokens: list[str]
    types: list[int]
    ids: dict[str, int | None]   # bos, eos, unknown, padding, eot, eom: the file's special ids
    notes: list[str]             # warnings for the user, filled while building


@dataclass
class _Built:
    tokenizer: Tokenizer
    add_bos: bool                # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token
    decoding: str                # "byte_level" or "byte_fallback" (see `tokenizer_config`)
    bos_always: bool = False     # llama.cpp adds BOS whatever the file says (Gemma 4)


def _merge_pair(merge: str) -> tuple[str, str] | None:
    """A `tokenizer.ggml.merges` entry split as llama.cpp splits it: at the first space after the first
    character (None for an entry without one)."""
    cut = merge.find(" ", 1)
    return None if cut < 0 else (merge[:cut], merge[cut + 1:])


def _file_merges(v: _Vocab, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The file's merges, best first, each pair once (the first occurrence ranks, as in llama.cpp's map).
    A merge of or into a piece the vocabulary lacks could only produce bytes llama.cpp drops: left out."""
    merges = v.meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("the GGUF's BPE vocabulary has no tokenizer.ggml.merges; it cannot be used")
    pairs: dict[tuple[str, str], None] = {}
    for m in merges:
        pair = _merge_pair(m)
        if pair is not None and pair[0] in vocab and pair[1] in vocab and pair[0] + pair[1] in vocab:
            pairs.setdefault(pair)
    return list(pairs)


def _byte_level(v: _Vocab) -> _Built:
    """Byte-level BPE (tokenizer.ggml.model == "gpt2"), split into words by llama.cpp's regexes for its
    `tokenizer.ggml.pre`."""
    name = v.meta.get("tokenizer.ggml.pre")
    if name is None:
        v.notes.append("the GGUF names no tokenizer.ggml.pre; splitting words as llama.cpp's 'default' does "
                       "(llama.cpp warns that generation quality will be degraded: re-convert the model)")
    pre = pre_tokenizer_for(name)
    vocab = {t: i for i, t in enumerate(v.tokens)}   # a repeated token keeps its last id, as in llama.cpp
    tok = Tokenizer(BPE(vocab=vocab, merges=_file_merges(v, vocab), fuse_unk=False, byte_fallback=False,
                        ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre.splits]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return _Built(tok, add_bos=pre.add_bos, decoding="byte_level")


def score_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce llama.cpp's SentencePiece tokenizer, best first.

    llama.cpp's SPM tokenizer repeatedly joins the adjacent pair whose joined text is the vocabulary's
    highest-scored token (leftmost on a tie). As BPE: every split of a token into two tokens is a merge,
    ranked by the score of the token it builds (higher first; equal scores keep vocabulary order). A
    token's splits rank together, so which split of it comes first never changes the result.
    """
    vocab = {t: i for i, t in enumerate(tokens)}   # a repeated token keeps its last id (as llama.cpp does)
    order = sorted(vocab, key=lambda t: (-scores[vocab[t]], vocab[t]))
    return [(t[:k], t[k:]) for t in order for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab]


def _escaped_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], unk_id: int | None, tokens: list[str],
                 space_prefix: bool) -> Tokenizer:
    """BPE over text whose spaces are "▁", falling back to <0xAB> byte tokens. With `space_prefix`, a "▁"
    goes before each run of text that starts the input or follows a special token (llama.cpp's
    add_space_prefix): the normalizer runs once per such run."""
    unk = tokens[unk_id] if unk_id is not None else None
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    escape = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if space_prefix else escape
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _sentencepiece(v: _Vocab) -> _Built:
    """llama.cpp's SPM tokenizer (tokenizer.ggml.model == "llama") as BPE ranked by the file's scores."""
    scores = v.meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) < len(v.tokens):
        raise ValueError("the GGUF's SentencePiece vocabulary has no tokenizer.ggml.scores for every token; "
                         "it cannot be used")
    # llama.cpp's SentencePiece defaults: bos 1, eos 2, unk 0, a space prefix, BOS added.
    for key, default in (("bos", 1), ("eos", 2), ("unknown", 0)):
        if v.ids[key] is None and default < len(v.tokens):
            v.ids[key] = default
    vocab = {t: i for i, t in enumerate(v.tokens)}
    tok = _escaped_bpe(vocab, score_merges(v.tokens, scores), v.ids["unknown"], v.tokens,
                       bool(v.meta.get("tokenizer.ggml.add_space_prefix", True)))
    return _Built(tok, add_bos=True, decoding="byte_fallback")


def _merged_sentencepiece(v: _Vocab) -> _Built:
    """Gemma 4's vocabulary (tokenizer.ggml.model == "gemma4"): BPE with the file's merges over "▁"-escaped
    text split only at newline runs, byte fallback, BOS always added (llama.cpp overrides the file)."""
    vocab = {t: i for i, t in enumerate(v.tokens)}
    tok = _escaped_bpe(vocab, _file_merges(v, vocab), v.ids["unknown"], v.tokens,
                       bool(v.meta.get("tokenizer.ggml.add_space_prefix", False)))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    return _Built(tok, add_bos=True, decoding="byte_fallback", bos_always=True)


# tokenizer.ggml.model -> the builder of its tokenizer.
TOKENIZER_MODELS = {"gpt2": _byte_level, "llama": _sentencepiece, "gemma4": _merged_sentencepiece}


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int], model_name: str | None) -> None:
    """llama.cpp's special-token cache as added tokens: CONTROL/UNKNOWN (and the control-looking texts)
    special, USER_DEFINED plain; all matched whole, as spelled in the file, longest first."""
    forced = set(control_texts(set(tokens)))
    special, plain = [], []
    for t, ty in zip(tokens, types, strict=True):
        if not t:
            continue
        if ty in (CONTROL, UNKNOWN) or t in forced:
            special.append(AddedToken(t, normalized=False, special=True, rstrip=rstrips(model_name, t)))
        elif ty == USER_DEFINED:
            plain.append(AddedToken(t, normalized=False, special=False, rstrip=rstrips(model_name, t)))
    tok.add_special_tokens(special)
    tok.add_tokens(plain)


def eos_ids_for(eos_id: int | None, tokens: list[str], extra_ids: tuple[int | None, ...] = ()) -> list[int]:
    """llama.cpp's end-of-generation ids: the file's eos, its eot/eom ids, then every end text the
    vocabulary holds (by text, as llama.cpp finds them), without repeats."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = [eos_id, *extra_ids, *sorted(ids[t] for t in eog_texts(set(ids)))]
    return list(dict.fromkeys(i for i in found if i is not None))


def tokenizer_config(tokens: list[str], bos_id: int | None, eos_ids: list[int], add_bos: bool,
                     byte_decoding: str, pad_id: int | None = None, unk_id: int | None = None,
                     add_eos: bool = False) -> dict:
    """tokenizer_config.json: HF's key names for the special tokens plus speczoo's ids and decoding kind.

    byte_decoding tells the incremental decoder how a token id maps to bytes: "byte_level" (GPT-2
    alphabet) or "byte_fallback" ("▁" is a space, "<0xAB>" is one byte).
    """
    def name(i):
        return None if i is None else tokens[i]
    return {
        "add_bos_token": bool(add_bos),
        "add_eos_token": bool(add_eos),
        "bos_token": name(bos_id),
        "eos_token": name(eos_ids[0]) if eos_ids else None,
        "pad_token": name(pad_id),
        "unk_token": name(unk_id),
        "bos_id": bos_id,
        "eos_ids": list(eos_ids),
        "byte_decoding": byte_decoding,
    }


def _post_processor(tokens: list[str], bos_id: int | None, eos_id: int | None, add_bos: bool, add_eos: bool):
    """BOS before and EOS after the text, as the file asks (llama.cpp's add_special)."""
    for wanted, i, what in ((add_bos, bos_id, "BOS"), (add_eos, eos_id, "EOS")):
        if wanted and i is None:
            raise ValueError(f"the GGUF asks to add a {what} token but names no tokenizer.ggml.{what.lower()}_token_id")
    before = [tokens[bos_id]] if add_bos else []
    after = [tokens[eos_id]] if add_eos else []
    specials = {(tokens[i], i) for i, on in ((bos_id, add_bos), (eos_id, add_eos)) if on}
    return processors.TemplateProcessing(
        single=" ".join([*before, "$A", *after]),
        pair=" ".join([*before, "$A", *after, *(f"{t}:1" for t in before), "$B:1", *(f"{t}:1" for t in after)]),
        special_tokens=sorted(specials))


def _valid_id(meta: Mapping, key: str, n_tokens: int, notes: list[str]) -> int | None:
    """A special token id from the file; one out of the vocabulary is dropped with a note (as llama.cpp does)."""
    i = meta.get(key)
    if i is not None and not 0 <= i < n_tokens:
        notes.append(f"the GGUF's {key} = {i} is outside its {n_tokens}-token vocabulary; ignored")
        return None
    return i


def tokenizer_from_gguf(reader: gguf.GGUFReader) -> GGUFTokenizer:
    """The tokenizer an open GGUF file describes."""
    return tokenizer_from_metadata(_ReaderMetadata(reader))


def tokenizer_from_metadata(meta: Mapping) -> GGUFTokenizer:
    """The tokenizer GGUF metadata (key -> value, as `zoo.gguf_metadata.read_gguf_metadata` reads it) describes."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None or kind is None:
        raise ValueError("the GGUF has no tokenizer (tokenizer.ggml.model / tokens missing); it cannot be used")
    if kind not in TOKENIZER_MODELS:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; speczoo reads {sorted(TOKENIZER_MODELS)} "
                         "('gpt2': byte-level BPE, 'llama': SentencePiece, 'gemma4': Gemma 4's BPE)")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"the GGUF lists {len(tokens)} tokens but {len(types)} token types; the file is damaged")
    notes: list[str] = []
    ids = {k: _valid_id(meta, f"tokenizer.ggml.{k}_token_id", len(tokens), notes)
           for k in ("bos", "eos", "unknown", "padding", "eot", "eom")}
    built = TOKENIZER_MODELS[kind](_Vocab(meta, tokens, types, ids, notes))
    tok = built.tokenizer
    _add_special_tokens(tok, tokens, types, meta.get("general.name"))
    add_bos = built.bos_always or bool(meta.get("tokenizer.ggml.add_bos_token", built.add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        tok.post_processor = _post_processor(tokens, ids["bos"], ids["eos"], add_bos, add_eos)
    eos_ids = eos_ids_for(ids["eos"], tokens, (ids["eot"], ids["eom"]))
    config = tokenizer_config(tokens, ids["bos"], eos_ids, add_bos, built.decoding, ids["padding"], ids["unknown"],
                              add_eos)
    return GGUFTokenizer(tokenizer=tok, config=config, chat_template=meta.get("tokenizer.chat_template"),
                         warnings=notes)


def read_tokenizer(gguf_path: Path, chat_template: str | None = None) -> SpeczooTokenizer:
    """speczoo's Tokenizer built from a GGUF file's metadata, as a pull would store it (seconds for a large
    vocabulary); `chat_template` fills a missing one. The build's notes become Python warnings."""
    built = tokenizer_from_metadata(read_gguf_metadata(gguf_path))
    for note in built.warnings:
        warnings.warn(f"{Path(gguf_path).name}: {note}", stacklevel=2)
    return SpeczooTokenizer(built.tokenizer, built.config, built.chat_template or chat_template)

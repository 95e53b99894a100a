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
  space is prefixed to every text run after a special token when `add_space_prefix` (default on).

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


def _merge_pair(merge: str) -> tuple[str, str] | None:
    """A `tokenizer.ggml.merges` entry split as llama.cpp splits it: at the first space after the first
    character (None for an entry without one)."""
    cut = merge.find(" ", 1)
    return None if cut < 0 else (merge[:cut], merge[cut + 1:])


def _byte_level(tokens: list[str], merges: list[str], pre: PreTokenizer) -> Tokenizer:
    """Byte-level BPE (tokenizer.ggml.model == "gpt2"), split into words by llama.cpp's regexes for `pre`."""
    vocab = {t: i for i, t in enumerate(tokens)}   # a repeated token keeps its last id, as in llama.cpp
    pairs: dict[tuple[str, str], None] = {}         # first occurrence ranks, as llama.cpp's map keeps it
    for m in merges:
        pair = _merge_pair(m)
        # A merge of a piece the vocabulary lacks could only ever produce bytes llama.cpp drops: leave it out.
        if pair is not None and pair[0] in vocab and pair[1] in vocab and pair[0] + pair[1] in vocab:
            pairs.setdefault(pair)
    tok = Tokenizer(BPE(vocab=vocab, merges=list(pairs), fuse_unk=False, byte_fallback=False,
                        ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre.splits]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


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


def _sentencepiece(tokens: list[str], scores: list[float], add_space_prefix: bool, unk_token: str | None) -> Tokenizer:
    """llama.cpp's SPM tokenizer (tokenizer.ggml.model == "llama") as BPE with byte fallback."""
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab=vocab, merges=score_merges(tokens, scores), unk_token=unk_token,
                        fuse_unk=True, byte_fallback=True))
    # llama.cpp escapes spaces as "▁" and, with add_space_prefix, puts one before each run of text that
    # starts the input or follows a special token: the normalizer runs once per such run.
    escape = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix else escape
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


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
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"the GGUF lists {len(tokens)} tokens but {len(types)} token types; the file is damaged")
    notes: list[str] = []
    bos_id, eos_id, unk_id, pad_id, eot_id, eom_id = (
        _valid_id(meta, f"tokenizer.ggml.{k}_token_id", len(tokens), notes)
        for k in ("bos", "eos", "unknown", "padding", "eot", "eom"))
    if kind == "gpt2":
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise ValueError("the GGUF's byte-level vocabulary has no tokenizer.ggml.merges; it cannot be used")
        pre_name = meta.get("tokenizer.ggml.pre")
        if pre_name is None:
            notes.append("the GGUF names no tokenizer.ggml.pre; splitting words as llama.cpp's 'default' does "
                         "(llama.cpp warns that generation quality will be degraded: re-convert the model)")
        pre = pre_tokenizer_for(pre_name)
        tok = _byte_level(tokens, merges, pre)
        add_bos_default, decoding = pre.add_bos, "byte_level"
    elif kind == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) < len(tokens):
            raise ValueError("the GGUF's SentencePiece vocabulary has no tokenizer.ggml.scores for every token; "
                             "it cannot be used")
        # llama.cpp's SentencePiece defaults: bos 1, eos 2, unk 0, a space prefix, BOS added.
        bos_id, eos_id, unk_id = (d if i is None else i for i, d in ((bos_id, 1), (eos_id, 2), (unk_id, 0)))
        tok = _sentencepiece(tokens, scores, bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                             tokens[unk_id] if unk_id < len(tokens) else None)
        add_bos_default, decoding = True, "byte_fallback"
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; speczoo reads 'gpt2' (byte-level BPE) "
                         "and 'llama' (SentencePiece)")
    _add_special_tokens(tok, tokens, types, meta.get("general.name"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        tok.post_processor = _post_processor(tokens, bos_id, eos_id, add_bos, add_eos)
    eos_ids = eos_ids_for(eos_id, tokens, (eot_id, eom_id))
    config = tokenizer_config(tokens, bos_id, eos_ids, add_bos, decoding, pad_id, unk_id, add_eos)
    return GGUFTokenizer(tokenizer=tok, config=config, chat_template=meta.get("tokenizer.chat_template"),
                         warnings=notes)


def read_tokenizer(gguf_path: Path, chat_template: str | None = None) -> SpeczooTokenizer:
    """speczoo's Tokenizer built from a GGUF file's metadata, as a pull would store it (seconds for a large
    vocabulary); `chat_template` fills a missing one. The build's notes become Python warnings."""
    built = tokenizer_from_metadata(read_gguf_metadata(gguf_path))
    for note in built.warnings:
        warnings.warn(f"{Path(gguf_path).name}: {note}", stacklevel=2)
    return SpeczooTokenizer(built.tokenizer, built.config, built.chat_template or chat_template)

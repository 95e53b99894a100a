"""The model-free acceptance proxy: how much would prompt lookup accept on this text?

Treat a text as the output of a greedy target and replay a prompt-lookup (n-gram) drafter over it:

* Tokenisation (default, documented rule): word pieces. A piece is a run of word characters
  (``\\w+``) or one other non-space character, each with the whitespace before it attached; trailing
  whitespace is a piece of its own. Joining the pieces gives back the text exactly. With a real
  tokenizer (``speczoo alpha --model NAME`` or ``--tokenizer tokenizer.json``) its ids are used instead.
* A round starts with i tokens committed. The drafter takes the last m tokens (m = n, then n-1, …, 1:
  falling back to shorter orders) and looks for their most recent earlier occurrence that has at
  least one token after it. The draft is the K tokens that followed that occurrence, copied LZ77
  style: a copy that runs into the present keeps copying its own draft, so a periodic text is drafted
  in full. No occurrence at any order → no draft.
* The "target" accepts the longest draft prefix equal to the text, then adds one token itself (the
  correction or bonus), exactly as greedy verification would; each round is one target forward.
  Drafts are cut at the end of the text.

Reported per text and per maximum order n: accepted per round, α = accepted / drafted, the fraction of
positions covered (accepted tokens / all tokens: the share of the text the drafter supplied), and
E[tokens per round] = tokens / rounds (the speed-up bound if drafting and verifying were free).

This module must never load a model or time anything: it is arithmetic over token ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from speczoo.decoding.drafters.ngram import NgramIndex

_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


def word_pieces(text: str) -> list[str]:
    """Split text into word pieces (see the module docstring); "".join(pieces) == text."""
    return _PIECE.findall(text)


def pieces_to_ids(pieces: list[str]) -> list[int]:
    """Number pieces by first appearance: equal pieces get equal ids, nothing more is needed."""
    vocab: dict[str, int] = {}
    return [vocab.setdefault(p, len(vocab)) for p in pieces]


def word_piece_ids(text: str) -> list[int]:
    return pieces_to_ids(word_pieces(text))


def parse_orders(spec: str) -> list[int]:
    """ "3" → [3]; "1..4" → [1, 2, 3, 4]; "1,2,4" → [1, 2, 4]. Orders must be >= 1."""
    spec = spec.strip()
    try:
        if ".." in spec:
            lo, hi = spec.split("..", 1)
            orders = list(range(int(lo), int(hi) + 1))
        else:
            orders = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--ngram expects N, LO..HI or N,N,... (e.g. 1..4), got {spec!r}") from None
    if not orders or min(orders) < 1:
        raise ValueError(f"--ngram orders must be >= 1 and the list non-empty, got {spec!r}")
    return sorted(set(orders))


@dataclass
class AlphaResult:
    name: str
    ngram: int                 # maximum n-gram order (falls back to n-1, ..., 1)
    k: int                     # maximum draft length per round
    tokens: int
    rounds: int                # target forwards (one per round, draft or not)
    drafted: int
    accepted: int
    rounds_with_draft: int
    pos_drafted: list[int] = field(default_factory=list)    # [K] rounds whose draft reached position j
    pos_accepted: list[int] = field(default_factory=list)   # [K] of those, position j accepted

    @property
    def accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def coverage(self) -> float:
        return self.accepted / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.pos_accepted, self.pos_drafted)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(accepted_per_round=self.accepted_per_round, alpha=self.alpha, coverage=self.coverage,
                 tokens_per_round=self.tokens_per_round,
                 acceptance_by_position=self.acceptance_by_position)
        return d


def simulate(ids: list[int], ngram: int, k: int, name: str = "", prompt: list[int] | None = None
             ) -> AlphaResult:
    """Replay prompt lookup (max order `ngram`, up to `k` draft tokens) over `ids` as the output.

    `prompt` ids, when given, are context the drafter may copy from but are not counted as output.
    """
    if ngram < 1 or k < 1:
        raise ValueError(f"ngram and k must be >= 1, got ngram={ngram}, k={k}")
    index = NgramIndex(ngram)
    index.extend(list(prompt or []))
    res = AlphaResult(name=name, ngram=ngram, k=k, tokens=len(ids), rounds=0, drafted=0, accepted=0,
                      rounds_with_draft=0, pos_drafted=[0] * k, pos_accepted=[0] * k)
    i, n_out = 0, len(ids)
    while i < n_out:
        draft = index.lookup(k)[: n_out - i]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == ids[i + accepted]:
            accepted += 1
        for j in range(len(draft)):
            res.pos_drafted[j] += 1
            res.pos_accepted[j] += int(accepted > j)
        emitted = min(accepted + 1, n_out - i)
        res.rounds += 1
        res.drafted += len(draft)
        res.accepted += accepted
        res.rounds_with_draft += int(bool(draft))
        index.extend(ids[i:i + emitted])
        i += emitted
    return res


Tokenize = Callable[[str], list[int]]


def tokenizer_from_file(path: str | Path) -> Tokenize:
    """A tokenizer.json (Hugging Face `tokenizers` format) or a .gguf file → text → ids, no specials."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    if path.suffix == ".gguf":
        from speczoo.zoo.gguf_tokenizer import read_tokenizer

        tok = read_tokenizer(path)
        return lambda text: tok.encode(text)
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(path))
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def tokenizer_for_model(name: str) -> Tokenize:
    """The tokenizer of a pulled zoo model (NotPulledError naming `speczoo pull NAME` otherwise)."""
    from speczoo.tokenizer import Tokenizer as SpeczooTokenizer
    from speczoo.zoo.bundle import find_bundle

    tok = SpeczooTokenizer.from_bundle(find_bundle(name))
    return lambda text: tok.encode(text)


def alpha_for_texts(texts: dict[str, str], orders: list[int], k: int,
                    tokenize: Tokenize = word_piece_ids) -> list[AlphaResult]:
    """Every text (name → text) at every maximum order; results ordered by text, then order."""
    results = []
    for name, text in texts.items():
        ids = tokenize(text)
        for n in orders:
            results.append(simulate(ids, n, k, name=name))
    return results


def render_table(results: list[AlphaResult]) -> str:
    """A plain-text table, one line per (text, order)."""
    head = f"{'file':<32} {'n':>2} {'tokens':>7} {'rounds':>7} {'acc/round':>9} {'alpha':>6} " \
           f"{'covered':>7} {'E[tok/round]':>12}"
    lines = [head, "-" * len(head)]
    for r in results:
        name = r.name if len(r.name) <= 32 else "…" + r.name[-31:]
        lines.append(f"{name:<32} {r.ngram:>2} {r.tokens:>7} {r.rounds:>7} {r.accepted_per_round:>9.3f} "
                     f"{r.alpha:>6.3f} {r.coverage:>7.1%} {r.tokens_per_round:>12.3f}")
    return "\n".join(lines)


def results_json(results: list[AlphaResult]) -> str:
    return json.dumps([r.to_dict() for r in results], indent=2)

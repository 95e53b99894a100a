"""Is this draft model a valid partner for this target? Checked whenever a draft is attached.

A draft from an incompatible export (another tokenizer, shifted special tokens, broken weights) does
not make output wrong — verification keeps it lossless — but it makes every draft miss, which looks
like a slow model. This check refuses such a pair with a message that shows what differs and what
tokenizer the target needs. A pair is judged by its tokenizers (the same tokens at the same ids, the
same specials, merges and pre-tokenizer), not by its embeddings' row counts: rows past the ids any text
produces are padding (Qwen2.5-0.5B has 151,936 rows, Qwen2.5-7B 152,064, over one tokenizer), and the
draft-model drafter proposes only ids the target has (drafters/draft_model.py SharedVocab).
It only reads tokenizers and runs one short prefill of each model; it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speczoo.cache import KVCache
from speczoo.errors import SpeczooError

SAMPLE_TEXT = ("def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
               "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
               "Les élèves ont répondu: « très bien » — 你好，世界! 🙂 <|im_start|> 3.14159")
# A prompt whose next token any working model of the family predicts the same way (a different model
# size may open a free answer differently, so the probe must be this unambiguous).
PROBE_TEXT = "Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


class PairError(SpeczooError):
    pass


@dataclass
class PairReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    draft_first: str = ""     # the probe's greedy continuation, as text
    target_first: str = ""
    needs: str = ""           # the target's architecture and tokenizer, in words: what a draft must share
    padding: str = ""         # how the embeddings' rows differ only by padding ("": they do not differ)
    gate_only: bool = False   # the tokenizers match; only the first-token gate failed

    def advice(self, target: str) -> str:
        """What to do about a refused pair: the draft the target needs."""
        if self.gate_only:
            return (f"The draft shares {target}'s tokenizer but not its predictions: a damaged file or an unrelated "
                    f"model; use a smaller model of {target}'s own family (the README lists known good pairs).")
        return (f"{target} needs a draft with its own tokenizer ({self.needs}): a smaller model of its own family, "
                "as Qwen2.5-0.5B is for Qwen2.5-7B (the README lists known good pairs); "
                f"`speczoo check-pair DRAFT {target}` checks a candidate.")

    def raise_if_bad(self, draft: str, target: str) -> None:
        if not self.ok:
            raise PairError(f"draft {draft} cannot draft for target {target}:\n  - " + "\n  - ".join(self.problems)
                            + "\n" + self.advice(target))


PROBE_TOKENS = 4


def _greedy_tokens(loaded, ids: list[int], rows: int, n: int = PROBE_TOKENS) -> list[int]:
    """The model's first n greedy tokens after `ids` (a short prefill, then single steps), picked among the
    first `rows` ids (those both models of the pair have)."""
    cache = KVCache(loaded.args, len(ids) + n + 1)
    out: list[int] = []
    with torch.inference_mode():
        logits = loaded.model(torch.tensor(ids), torch.arange(len(ids)), cache).logits
        for i in range(n):
            out.append(int(logits[-1, :rows].argmax()))
            if i + 1 < n:
                logits = loaded.model(torch.tensor(out[-1:]), torch.tensor([len(ids) + i]), cache).logits
    return out


def _row_problems(draft, target) -> list[str]:
    """Each model's embedding must hold every id its tokenizer produces."""
    out = []
    for role, m in (("draft", draft), ("target", target)):
        if m.args.vocab_size < m.tokenizer.text_vocab_size:
            out.append(f"the {role}'s embedding has {m.args.vocab_size:,} rows, but its tokenizer produces ids up "
                       f"to {m.tokenizer.text_vocab_size - 1:,}: the model file is damaged")
    return out


def check_pair(draft, target) -> PairReport:
    """draft, target: runtime.LoadedModel. Tokenizers (Tokenizer.differences), each model's rows against
    its tokenizer, special ids, a sample text, then the first-token gate."""
    dt, tt = draft.tokenizer, target.tokenizer
    rows_d, rows_t = draft.args.vocab_size, target.args.vocab_size
    problems = dt.differences(tt, ("the draft", "the target"))
    if problems and rows_d != rows_t:
        problems.append(f"vocabulary sizes differ: draft {rows_d:,}, target {rows_t:,}")
    problems += _row_problems(draft, target)
    if sorted(dt.eos_ids) != sorted(tt.eos_ids):
        problems.append(f"end-of-sequence ids differ: draft {sorted(dt.eos_ids)}, target {sorted(tt.eos_ids)}")
    if dt.bos_id != tt.bos_id:
        problems.append(f"begin-of-sequence ids differ: draft {dt.bos_id}, target {tt.bos_id}")
    d_ids, t_ids = dt.encode(SAMPLE_TEXT), tt.encode(SAMPLE_TEXT)
    if d_ids != t_ids:
        n = next((i for i, (a, b) in enumerate(zip(d_ids, t_ids)) if a != b), min(len(d_ids), len(t_ids)))
        problems.append(f"tokenizers disagree on sample text at id {n}: draft {d_ids[n:n + 4]}, "
                        f"target {t_ids[n:n + 4]}")
    report = PairReport(ok=not problems, problems=problems, needs=f"{target.args.arch} architecture, {tt.describe()}")
    if problems:
        return report
    if rows_d != rows_t:
        report.padding = (f"the draft's {rows_d:,} embedding rows and the target's {rows_t:,} differ only by padding "
                          f"(no text produces an id from {tt.text_vocab_size:,} up)")
    ids = tt.encode(PROBE_TEXT, add_special=True)
    shared = min(rows_d, rows_t)
    d_first, t_first = _greedy_tokens(draft, ids, shared), _greedy_tokens(target, ids, shared)
    report.draft_first, report.target_first = dt.decode(d_first), tt.decode(t_first)
    if d_first != t_first:
        report.ok, report.gate_only = False, True
        report.problems.append(f"first-token gate: after {PROBE_TEXT!r} the draft continues {d_first} "
                               f"({report.draft_first!r}) but the target continues {t_first} "
                               f"({report.target_first!r})")
    return report

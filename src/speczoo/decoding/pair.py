"""Is this draft model a valid partner for this target? Checked whenever a draft is attached.

A draft from an incompatible export (another tokenizer, shifted special tokens, broken weights) does
not make output wrong — verification keeps it lossless — but it makes every draft miss, which looks
like a slow model. This check refuses such a pair with a message that shows what differs.
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

    def raise_if_bad(self, draft: str, target: str) -> None:
        if not self.ok:
            raise PairError(f"draft {draft} cannot draft for target {target}:\n  - " + "\n  - ".join(self.problems)
                            + "\nUse a draft of the same tokenizer family (see `speczoo models`).")


PROBE_TOKENS = 4


def _greedy_tokens(loaded, ids: list[int], n: int = PROBE_TOKENS) -> list[int]:
    """The model's first n greedy tokens after `ids` (a short prefill, then single steps)."""
    cache = KVCache(loaded.args, len(ids) + n + 1)
    out: list[int] = []
    with torch.inference_mode():
        logits = loaded.model(torch.tensor(ids), torch.arange(len(ids)), cache).logits
        for i in range(n):
            out.append(int(logits[-1].argmax()))
            if i + 1 < n:
                logits = loaded.model(torch.tensor(out[-1:]), torch.tensor([len(ids) + i]), cache).logits
    return out


def check_pair(draft, target) -> PairReport:
    """draft, target: runtime.LoadedModel. Vocabulary, special tokens, tokenizer, first-token gate."""
    problems = []
    dt, tt = draft.tokenizer, target.tokenizer
    if draft.args.vocab_size != target.args.vocab_size:
        problems.append(f"vocabulary sizes differ: draft {draft.args.vocab_size}, target {target.args.vocab_size}")
    if sorted(dt.eos_ids) != sorted(tt.eos_ids):
        problems.append(f"end-of-sequence ids differ: draft {sorted(dt.eos_ids)}, target {sorted(tt.eos_ids)}")
    if dt.bos_id != tt.bos_id:
        problems.append(f"begin-of-sequence ids differ: draft {dt.bos_id}, target {tt.bos_id}")
    d_ids, t_ids = dt.encode(SAMPLE_TEXT), tt.encode(SAMPLE_TEXT)
    if d_ids != t_ids:
        n = next((i for i, (a, b) in enumerate(zip(d_ids, t_ids)) if a != b), min(len(d_ids), len(t_ids)))
        problems.append(f"tokenizers disagree on sample text at id {n}: draft {d_ids[n:n + 4]}, "
                        f"target {t_ids[n:n + 4]}")
    report = PairReport(ok=not problems, problems=problems)
    if problems:
        return report
    ids = tt.encode(PROBE_TEXT, add_special=True)
    d_first, t_first = _greedy_tokens(draft, ids), _greedy_tokens(target, ids)
    report.draft_first, report.target_first = dt.decode(d_first), tt.decode(t_first)
    if d_first != t_first:
        report.ok = False
        report.problems.append(f"first-token gate: after {PROBE_TEXT!r} the draft continues {d_first} "
                               f"({report.draft_first!r}) but the target continues {t_first} "
                               f"({report.target_first!r})")
    return report

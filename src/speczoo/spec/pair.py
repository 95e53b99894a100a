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
PROBE_MESSAGES = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


class PairError(SpeczooError):
    pass


@dataclass
class PairReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    draft_first: str = ""
    target_first: str = ""

    def raise_if_bad(self, draft: str, target: str) -> None:
        if not self.ok:
            raise PairError(f"draft {draft} cannot draft for target {target}:\n  - " + "\n  - ".join(self.problems)
                            + "\nUse a draft of the same tokenizer family (see `speczoo models`).")


def _first_token(loaded, ids: list[int]) -> int:
    cache = KVCache(loaded.args, len(ids) + 1)
    with torch.inference_mode():
        logits = loaded.model(torch.tensor(ids), torch.arange(len(ids)), cache).logits
    return int(logits[-1].argmax())


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
    ids = tt.encode(tt.apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True))
    d_first, t_first = _first_token(draft, ids), _first_token(target, ids)
    report.draft_first, report.target_first = dt.decode([d_first]), tt.decode([t_first])
    if d_first != t_first:
        report.ok = False
        report.problems.append(f"first-token gate: on a fixed prompt the draft's argmax is {d_first} "
                               f"({report.draft_first!r}) but the target's is {t_first} ({report.target_first!r})")
    return report

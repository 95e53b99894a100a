"""The transformers peer of `speczoo peers` ("hf"): the target GGUF dequantized to bf16 by transformers.

Methods, all `generate(do_sample=False)` on speczoo's prompt ids, stopping at the target's EOS ids:
* "greedy": plain greedy decoding (the family's reference);
* "lookup": `prompt_lookup_num_tokens=K` (transformers' prompt-lookup candidate generator);
* "assistant": `assistant_model=` the draft model, also bf16 from its own GGUF, with transformers'
  default assistant schedule (it starts at 20 candidates and adapts).
Plain greedy is timed from the first new token (a streamer notes when it arrives). The assisted modes
run the prefill inside their first round, so they are timed as the whole call minus the prefill time
greedy took on the same prompt (greedy always runs first for a prompt); the assistant's own prefill
therefore counts as decode time, which is what a user of assisted generation pays.

This module imports transformers lazily and never falls back silently: a missing package is a
PeerError that says how to install it.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from speczoo.bench.peers import (
    INSTALL_HINT, PeerOutput, PeerError, PeerPrompt, PeerSettings, cut_at_eos, timed_tokens)


class FirstTokenTimer:
    """A transformers streamer that notes when the first generated token arrives (the prompt comes first)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _transformers():
    try:
        import transformers
        from transformers.generation.streamers import BaseStreamer
    except ImportError as exc:
        raise PeerError(f"transformers cannot be imported ({exc}); {INSTALL_HINT}") from None
    transformers.logging.set_verbosity_error()
    return transformers, BaseStreamer


class HFFamily:
    name = "hf"
    warm_up = True

    def __init__(self, settings: PeerSettings):
        self.settings = settings
        self.model = None
        self.draft = None
        self._prefill: dict[int, float] = {}      # question id -> greedy's prefill seconds
        self._streamer_cls = None
        self._tr = None                            # (transformers, BaseStreamer) once open()

    def methods(self) -> list[str]:
        return ["greedy", "lookup", *(["assistant"] if self.settings.draft_gguf else [])]

    def describe(self, method: str) -> str:
        return {"greedy": "transformers bf16, generate(do_sample=False)",
                "lookup": f"transformers bf16, prompt_lookup_num_tokens={self.settings.k}",
                "assistant": f"transformers bf16, assistant_model={self.settings.draft} (bf16)"}[method]

    def reference(self, method: str) -> tuple[str, str] | None:
        return None if method == "greedy" else ("hf:greedy", "ids")

    def _load(self, gguf_path):
        import torch

        tr, _ = self._tr
        model = tr.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                        dtype=torch.bfloat16)
        model.eval()
        return model

    def open(self) -> None:
        import torch

        self._tr = _transformers()
        base = self._tr[1]
        self._streamer_cls = type("FirstTokenStreamer", (FirstTokenTimer, base), {})
        torch.set_num_threads(self.settings.threads)
        self.model = self._load(self.settings.target_gguf)

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        import torch

        s = self.settings
        if method == "assistant" and self.draft is None:
            # A model drafting for itself is the same weights: load them once (a GGUF load is most of a
            # short run's time); the assistant keeps its own cache either way.
            same = Path(s.draft_gguf).resolve() == Path(s.target_gguf).resolve()
            self.draft = self.model if same else self._load(s.draft_gguf)
        if method != "greedy" and prompt.question_id not in self._prefill:
            raise PeerError(f"hf:{method} needs hf:greedy to run first on question {prompt.question_id} "
                            "(its prefill time is subtracted); include hf:greedy in --systems")
        extra = {"greedy": {}, "lookup": {"prompt_lookup_num_tokens": s.k},
                 "assistant": {"assistant_model": self.draft}}[method]
        input_ids = torch.tensor([prompt.ids], dtype=torch.long)                 # [1, S]
        timer = self._streamer_cls()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                      top_p=None, top_k=None, eos_token_id=list(s.eos_ids),
                                      pad_token_id=s.eos_ids[0], streamer=timer, **extra)   # [1, S + n]
        t_end = time.perf_counter()
        ids, finish = cut_at_eos(out[0, len(prompt.ids):].tolist(), s.eos_ids)
        if method == "greedy":
            first = timer.first or t_end
            self._prefill[prompt.question_id] = first - t0
            seconds, timing = t_end - first, "first-token"
        else:
            total = t_end - t0
            seconds, timing = total - self._prefill[prompt.question_id], "total-minus-prefill"
            if seconds <= 0.1 * total:   # a noisy machine made greedy's prefill look longer than this call
                seconds, timing = total, "total"
        text = s.tokenizer.decode(ids) if s.tokenizer is not None else ""
        return PeerOutput(ids=ids, text=text, finish=finish, seconds=seconds,
                          tokens=timed_tokens(len(ids), finish), total_seconds=t_end - t0, timing=timing)

    def close(self) -> None:
        self.model = None
        self.draft = None
        gc.collect()

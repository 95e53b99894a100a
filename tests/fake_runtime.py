"""A deterministic, model-free stand-in for `speczoo.runtime.Runtime`, for fast tests of its consumers.

It honours the Runtime contract the server and the chat rely on: `generate(request)` validates eagerly
(errors raise before any event), then yields `TokenEvent`s (UTF-8-safe text, stop strings already cut)
and one final `DoneEvent`; closing the generator early cancels the generation. Its output is a pure
function of (prompt ids, sampling temperature, seed): greedy output is identical whatever the `spec`
mode, only the grouping of tokens into rounds and the drafted/accepted counts change, as with the real
lossless engine. It is NOT thread-safe on purpose: a second `generate` started while one is still open
raises, so a consumer that leaks a generation (or runs two at once) fails loudly.

It must never import torch or a model: tests that use it run in milliseconds.

`make_test_runtime()` is the switch between this fake and the real runtime (see its docstring).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, Stats, TokenEvent, TokenLogprob
from speczoo.facts import ModelFacts
from speczoo.request import GenerationRequest

EOS = 256
# Words the fake "model" speaks; multi-byte ones check UTF-8-safe streaming.
WORDS = ["the", "cache", "draft", "target", "token", "round", "verify", "accept", "café", "naïve",
         "⚡", "loop", "zoo", "fast", "cpu", "kernel", "greedy", "π", "def", "return"]


class FakeTokenizer:
    """Byte-level: ids 0..255 are UTF-8 bytes, 256 is EOS; a ChatML-like chat template (tools, when given, in
    a system turn)."""

    eos_ids = [EOS]
    chat_template = None        # the template's text (set it to one with <tool_call> to offer tools)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def piece_bytes(self, i: int) -> bytes:
        return bytes([i]) if i < 256 else b""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        out = f"<|im_start|>system\n<tools>{json.dumps(tools)}</tools><|im_end|>\n" if tools else ""
        out += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
        return out


@dataclass(eq=False)
class GenerationLog:
    """What happened to one `generate` call (tests read these)."""

    request: GenerationRequest
    events: int = 0
    finished: bool = False      # yielded its DoneEvent
    closed_early: bool = False  # the consumer closed the generator before the DoneEvent


@dataclass
class FakeRuntime:
    name: str = "fake-model"
    max_seq: int = 512
    delay: float = 0.0                  # seconds slept per round (to make streams slow)
    prefill_delay: float = 0.0          # seconds slept before the first round (a long prompt's prefill)
    answer_words: int = 40              # words in a full answer before EOS
    answer_text: str | None = None      # a fixed answer instead of the words (e.g. Markdown for the page)
    vocab_size: int = EOS + 1           # valid token ids: 0 .. vocab_size - 1
    spec_modes: list[str] = field(default_factory=lambda: ["off", "ngram", "draft", "auto"])
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    log: list[GenerationLog] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._busy = threading.Lock()

    # -- the deterministic "model" ---------------------------------------------------------
    def answer_ids(self, request: GenerationRequest) -> list[int]:
        """The full token sequence the model would produce (ending in EOS), ignoring limits."""
        if self.answer_text is not None:
            return self.tokenizer.encode(self.answer_text) + [EOS]
        key = hashlib.sha256(bytes(str(request.prompt_ids), "ascii")).digest()
        s = request.sampling
        if not s.greedy:  # sampling: depends on the seed (None: fresh randomness)
            extra = os.urandom(8) if s.seed is None else f"{s.seed}:{s.temperature}".encode()
            key = hashlib.sha256(key + extra).digest()
        rng = random.Random(key)
        words = [rng.choice(WORDS) for _ in range(self.answer_words)]
        return self.tokenizer.encode(" ".join(words) + ".") + [EOS]

    def _rounds(self, request: GenerationRequest, n: int) -> list[tuple[int, int, int]]:
        """Split n tokens into rounds: (tokens emitted, drafted, accepted); depends on the spec mode."""
        if request.spec == "off":
            return [(1, 0, 0)] * n
        rng = random.Random(f"{request.spec}:{request.k}")
        out, left = [], n
        while left > 0:
            drafted = request.k
            accepted = rng.randint(0, drafted)
            emit = min(accepted + 1, left)
            out.append((emit, drafted, min(accepted, emit)))
            left -= emit
        return out

    # -- the Runtime contract --------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
        self._validate(request)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("FakeRuntime.generate called while another generation is still open "
                               "(the runtime is single-threaded and owns one KV cache)")
        entry = GenerationLog(request)
        self.log.append(entry)
        return self._run(request, entry)

    def batch(self, n_slots: int, chunk: int = 0) -> "FakeBatch":
        """The Runtime.batch contract (textgen.TextBatch's): up to n_slots generations at once."""
        return FakeBatch(self, n_slots)

    def slot_bytes(self) -> int:
        return 1 << 20

    def facts(self) -> ModelFacts:
        return ModelFacts(arch="fake", quantization="Q8_0", size=1 << 20, digest="sha256:" + "0" * 64,
                          modified="2026-01-01T00:00:00+00:00", context=self.max_seq,
                          chat_template="{% for m in messages %}<|im_start|>{{ m.role }}...{% endfor %}")

    def cannot_batch(self) -> str | None:
        return None

    def _validate(self, request: GenerationRequest) -> None:
        request.sampling.validate()
        if not request.prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if any(not 0 <= i < self.vocab_size for i in request.prompt_ids):
            raise ValueError(f"a prompt token id is outside the vocabulary (0..{self.vocab_size - 1})")
        if request.spec not in self.spec_modes:
            raise ValueError(f"unknown spec mode {request.spec!r}: use one of {self.spec_modes}")
        need = len(request.prompt_ids) + request.max_new_tokens
        if need > self.max_seq:
            raise CacheFullError(f"prompt + max_new_tokens = {need} exceeds the context of {self.max_seq}")

    def _run(self, request: GenerationRequest, entry: GenerationLog) -> Iterator[TokenEvent | DoneEvent]:
        try:
            yield from self._events(request, entry)
        except GeneratorExit:
            entry.closed_early = not entry.finished
            raise
        finally:
            self._busy.release()

    def _events(self, request: GenerationRequest, entry: GenerationLog) -> Iterator[TokenEvent | DoneEvent]:
        full = self.answer_ids(request)
        stats = Stats(prompt_tokens=len(request.prompt_ids), drafter=request.spec)
        t0 = time.perf_counter()
        ids: list[int] = []
        emitted = ""
        finish = "length"
        pos = 0
        if self.prefill_delay:
            time.sleep(self.prefill_delay)
        for emit, drafted, accepted in self._rounds(request, len(full)):
            if self.delay:
                time.sleep(self.delay)
            new = full[pos:pos + emit]
            pos += emit
            if len(ids) + len(new) > request.max_new_tokens:
                new = new[:request.max_new_tokens - len(ids)]
            hit_eos = EOS in new
            if hit_eos:
                new = new[:new.index(EOS) + 1]
            ids.extend(new)
            stats.rounds += 1
            stats.drafted += drafted
            stats.accepted += min(accepted, len(new))
            stats.new_tokens = len(ids)
            text = self.tokenizer.decode(ids)
            stopped = False
            for s in request.stop:
                at = text.find(s)
                if s and at != -1:
                    text, stopped = text[:at], True
            hold = 0 if (stopped or hit_eos) else _hold_back(text, request.stop)
            delta = text[len(emitted):len(text) - hold]
            emitted += delta
            entry.events += 1
            yield TokenEvent(ids=new, text=delta, drafted=drafted, accepted=min(accepted, len(new)),
                             logprobs=fake_logprobs(new, request.logprobs))
            if hit_eos or stopped:
                finish = "stop"
                break
            if len(ids) >= request.max_new_tokens:
                break
        stats.seconds = max(time.perf_counter() - t0, 1e-6)
        final = self.tokenizer.decode(ids) if finish == "length" else emitted
        if finish == "length" and final != emitted:   # flush held-back text at the end
            yield TokenEvent(ids=[], text=final[len(emitted):])
        entry.events += 1
        entry.finished = True
        yield DoneEvent(finish_reason=finish, text=final, ids=ids, stats=stats,
                        logprobs=fake_logprobs(ids, request.logprobs))


def fake_logprobs(ids: list[int], top: int | None) -> list[TokenLogprob] | None:
    """A made-up log-probability per id, a function of the id alone (so the same whatever the rounds),
    with `top` alternatives headed by the id itself."""
    if top is None:
        return None
    return [TokenLogprob(i, -(i % 7) / 8, tuple((i + j, -(i % 7) / 8 - j) for j in range(top))) for i in ids]


class FakeBatch:
    """FakeRuntime's answers, up to n_slots at once: each step moves every running generation by one
    round (one event), as a batched forward would; first come first served into free slots; a cancelled
    one leaves at the next step. The same events per request as FakeRuntime.generate."""

    def __init__(self, runtime: FakeRuntime, n_slots: int):
        self.runtime, self.n_slots = runtime, n_slots
        self._waiting: list[GenerationLog] = []
        self._running: dict[GenerationLog, Iterator] = {}
        self.steps = 0
        self.size = 0

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def spec_modes(self) -> list[str]:
        return self.runtime.spec_modes

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, request: GenerationRequest) -> GenerationLog:
        self.runtime._validate(request)
        entry = GenerationLog(request)
        self.runtime.log.append(entry)
        self._waiting.append(entry)
        return entry

    def cancel(self, entry: GenerationLog) -> None:
        entry.closed_early = not entry.finished
        if entry in self._waiting:
            self._waiting.remove(entry)

    def step(self) -> list[tuple[GenerationLog, list]]:
        for entry in [e for e in self._running if e.closed_early]:
            self._running.pop(entry).close()
        while self._waiting and len(self._running) < self.n_slots:
            entry = self._waiting.pop(0)
            self._running[entry] = self.runtime._events(entry.request, entry)
        self.steps += 1
        self.size = len(self._running)
        out = []
        for entry, gen in list(self._running.items()):
            if entry.closed_early:
                continue
            event = next(gen)
            out.append((entry, [event]))
            if isinstance(event, DoneEvent):
                del self._running[entry]
        return out


def _hold_back(text: str, stop: list[str]) -> int:
    """Trailing characters to keep back: an incomplete UTF-8 character or a stop-string prefix."""
    hold = len(text) - len(text.rstrip("\ufffd"))
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


_REAL: dict[str, object] = {}


def make_test_runtime(**fake_kwargs):
    """The runtime the serve/chat tests run against.

    Default: a fresh `FakeRuntime(**fake_kwargs)`. With SPECZOO_TEST_RUNTIME=real: the real runtime,
    `speczoo.runtime.load_runtime(SPECZOO_TEST_TARGET or "qwen2.5-coder-0.5b",
    draft=SPECZOO_TEST_DRAFT, backend=SPECZOO_TEST_BACKEND, max_seq=SPECZOO_TEST_MAX_SEQ or 1024)`,
    loaded once per test session and shared (the fake-only knobs in `fake_kwargs`, max_seq included,
    are then ignored; tests read `runtime.max_seq`). Tests that need the fake's log or delay check `is_fake(runtime)`.
    """
    if os.environ.get("SPECZOO_TEST_RUNTIME", "fake") != "real":
        return FakeRuntime(**fake_kwargs)
    if "runtime" not in _REAL:
        from speczoo.runtime import load_runtime
        _REAL["runtime"] = load_runtime(os.environ.get("SPECZOO_TEST_TARGET", "qwen2.5-coder-0.5b"),
                                        draft=os.environ.get("SPECZOO_TEST_DRAFT") or None,
                                        backend=os.environ.get("SPECZOO_TEST_BACKEND") or None,
                                        max_seq=int(os.environ.get("SPECZOO_TEST_MAX_SEQ", "1024")))
    return _REAL["runtime"]


def is_fake(runtime) -> bool:
    return isinstance(runtime, FakeRuntime)


def fake_local_suite(monkeypatch) -> FakeRuntime:
    """Make `speczoo suite`'s local run load a FakeRuntime (backend "fake-backend") and find a bundle and its GGUF
    for any name (/zoo/NAME, /zoo/NAME.gguf), so the command runs end to end without a model; returns it."""
    import speczoo.zoo.bundle as bundle

    runtime = FakeRuntime(max_seq=100_000)
    runtime.target = types.SimpleNamespace(backend="fake-backend")
    fake = types.ModuleType("speczoo.runtime")
    fake.load_runtime = lambda target, **kw: runtime
    monkeypatch.setitem(sys.modules, "speczoo.runtime", fake)
    monkeypatch.setattr(bundle, "find_bundle", lambda name: Path(f"/zoo/{name}"))
    monkeypatch.setattr(bundle, "source_gguf", lambda path: path.with_suffix(".gguf"))
    return runtime

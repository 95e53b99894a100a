"""`speczoo peers`: the same questions through llama.cpp, transformers and speczoo, side by side.

Every system gets the SAME GGUF weights (the file the zoo bundle was converted from), the SAME prompt
ids (the first turn of each question rendered through the target's chat template and encoded ONCE by
speczoo's tokenizer; later turns are not run), the same thread count, greedy decoding, and the same
stop rule (the target's EOS ids or `max_new_tokens`). Systems come in families; a family's first method
is its own greedy reference, and every other method of the family is judged lossless when its output
equals that reference's (token ids, or text where the system only returns text).

Timing (one definition for every system; each row names how its seconds were taken, field `timing`):
* tok/s = timed tokens / timed seconds. The first new token comes out of the prefill, so the timed
  tokens are the decode steps after it: new tokens − 1, plus 1 when the output ended at EOS (the EOS
  step was paid for but is not part of the output).
* "first-token": seconds from the first new token to the last one (HF greedy);
  "engine": speczoo's own decode seconds (after prefill); "total-minus-prefill": HF's assisted modes
  do not separate prefill, so their seconds are the whole `generate` call minus the prefill time HF
  greedy took on the same prompt ("total", prefill included, when machine noise made that difference
  under a tenth of the call); "reported": llama-server's own `predicted_ms` (first new token to last).
* The ratio of a system to the baseline (llama.cpp greedy by default) pairs the two on the questions
  both ran, per category; overall = geometric mean over categories (speczoo.bench.report's rules;
  the table: peers_summary.py).

Peers are optional: transformers comes with `pip install -e '.[peers]'`, llama.cpp's llama-server from
`bash benchmarks/build_llama.sh`; a family whose package or tool is missing is skipped with a note that
says how to get it, and the others still run. This module never installs anything, never downloads
weights, and never imports transformers itself (the family modules do, lazily). Rows go to OUT/peers.jsonl as they finish; a run is not resumable (a rerun starts
the file again), so keep runs short.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from speczoo.bench import report
from speczoo.bench.peers_summary import BASELINE, PeersSummary, render_markdown, summarize
from speczoo.bench.questions import Question, categories_of
from speczoo.bench.suite import first_mismatch
from speczoo.errors import SpeczooError

ROWS_FILE = "peers.jsonl"
REPORT_FILE = "peers.md"
INSTALL_HINT = "pip install -e '.[peers]' (transformers, accelerate)"


class PeerError(SpeczooError):
    """A peer system could not run (missing package or tool, failed subprocess); says what to do."""


@dataclass
class PeerPrompt:
    question_id: int
    category: str
    text: str                 # the first turn rendered through the chat template (generation prompt on)
    ids: list[int]            # `text` encoded by speczoo's tokenizer: what every system is fed


@dataclass
class PeerSettings:
    target: str
    target_gguf: Path
    eos_ids: list[int]
    draft: str | None = None
    draft_gguf: Path | None = None
    max_new_tokens: int = 96
    threads: int = 2
    k: int = 8                # draft length / prompt-lookup tokens for every system that takes one
    n_ctx: int = 512          # context for every system: longest prompt + max_new_tokens + margin
    warmup: int = 4           # new tokens of an untimed answer per method before timing (0: none)
    backend: str | None = None          # speczoo's linear backend (None: the runtime's default)
    llama_server: str | None = None     # path of llama-server (None: serve_load_llama.find_llama_server's search)
    tokenizer: object | None = None     # speczoo's Tokenizer of the target: text of id-only systems
    vllm_venv: Path | None = None       # vLLM's own virtual environment (benchmarks/build_vllm.sh)
    vllm_head: Path | None = None       # an EAGLE-3 head folder (speculators format) for vllm:eagle3
    vllm_dtype: str = "bfloat16"        # what vLLM computes in (its weights: the GGUF dequantized)


@dataclass
class PeerOutput:
    """One system's answer to one prompt, and how it was timed."""

    ids: list[int]            # new tokens, EOS excluded ([] where the system returns only text)
    text: str
    finish: str               # "stop" (EOS) or "length"
    seconds: float            # timed seconds, see `timing`
    tokens: int               # tokens those seconds produced (see `timed_tokens`)
    total_seconds: float      # the whole call, prefill included (0 where unknown)
    timing: str               # "first-token" | "engine" | "total-minus-prefill" | "total" | "reported"
    new_tokens: int = -1      # defaults to len(ids)
    drafted: int | None = None
    accepted: int | None = None

    def __post_init__(self) -> None:
        if self.new_tokens < 0:
            self.new_tokens = len(self.ids)


def timed_tokens(new_tokens: int, finish: str) -> int:
    """Decode steps after the prefill's first token: n − 1, plus the EOS step when it stopped there."""
    return max(0, new_tokens - 1 + (1 if finish == "stop" else 0))


def cut_at_eos(ids: list[int], eos_ids: list[int]) -> tuple[list[int], str]:
    """(ids before the first EOS, "stop") or (ids, "length") when there is no EOS."""
    eos = set(eos_ids)
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i], "stop"
    return ids, "length"


# -- systems and families --------------------------------------------------------------------------

class PeerFamily(Protocol):
    """A group of systems that share one loaded model; `methods()[0]` is the family's greedy."""

    name: str
    warm_up: bool             # run each method once untimed first (False: every call is a fresh process)

    def methods(self) -> list[str]: ...

    def describe(self, method: str) -> str: ...

    def reference(self, method: str) -> tuple[str, str] | None:
        """(system whose output this method must equal, "ids" or "text"); None for a reference."""

    def open(self) -> None: ...

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FamilyEntry:
    module: str               # where the family class lives (imported only when it runs)
    cls: str
    requires: tuple[str, ...]  # import names that must be present (checked without importing them)
    serial: bool = False      # one method at a time (a server per method): all prompts of a method, then the next


# Run order: the baseline first, then the other peers, speczoo last.
FAMILIES: dict[str, FamilyEntry] = {
    "llama": FamilyEntry("speczoo.bench.peers_llama", "LlamaServerFamily", ()),
    "hf": FamilyEntry("speczoo.bench.peers_hf", "HFFamily", ("transformers", "accelerate", "gguf")),
    "vllm": FamilyEntry("speczoo.bench.peers_vllm", "VllmFamily", ("openai", "transformers", "gguf"), serial=True),
    "speczoo": FamilyEntry("speczoo.bench.peers", "SpeczooFamily", ()),
}


def missing_modules(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def missing_message(family: str, modules: list[str]) -> str:
    """What to tell a user whose environment lacks a peer's packages."""
    names = ", ".join(modules)
    return f"{family}: skipped, {names} not installed; to run it: {INSTALL_HINT}"


def parse_systems(spec: str | None, families: list[str] | None = None) -> dict[str, list[str] | None]:
    """ "llama,hf:lookup,speczoo" → {family: None (all its methods) or [chosen methods]}, run order kept."""
    families = families or list(FAMILIES)
    if not spec:
        return {f: None for f in families}
    chosen: dict[str, list[str] | None] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        fam, _, method = item.partition(":")
        if fam not in families:
            raise ValueError(f"--systems: unknown family {fam!r}; use one of {', '.join(families)} "
                             "(optionally FAMILY:METHOD, e.g. hf:lookup)")
        if not method:
            chosen[fam] = None
        elif chosen.get(fam, []) is not None:
            chosen.setdefault(fam, []).append(method)
    return {f: chosen[f] for f in families if f in chosen}


def make_family(name: str, settings: PeerSettings) -> PeerFamily:
    entry = FAMILIES[name]
    module = importlib.import_module(entry.module)
    return getattr(module, entry.cls)(settings)


# -- speczoo itself --------------------------------------------------------------------------------

class SpeczooFamily:
    """speczoo's runtime on the target bundle: off (its greedy), ngram, draft (with a draft), auto."""

    name = "speczoo"
    warm_up = True

    def __init__(self, settings: PeerSettings, runtime=None):
        self.settings = settings
        self.runtime = runtime        # tests pass a fake; open() loads the real one otherwise

    def methods(self) -> list[str]:
        return ["off", "ngram", *(["draft"] if self.settings.draft else []), "auto"]

    def describe(self, method: str) -> str:
        return {"off": "plain greedy", "ngram": f"prompt lookup (n-gram ≤ 3), K ≤ {self.settings.k}",
                "draft": f"draft model {self.settings.draft}, K ≤ {self.settings.k}",
                "auto": "cost-model controller picks drafter and K per round"}[method]

    def reference(self, method: str) -> tuple[str, str] | None:
        return None if method == "off" else ("speczoo:off", "ids")

    def open(self) -> None:
        if self.runtime is None:
            from speczoo.runtime import load_runtime
            s = self.settings
            self.runtime = load_runtime(s.target, draft=s.draft, backend=s.backend, max_seq=s.n_ctx)

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        from speczoo.events import DoneEvent
        from speczoo.request import GenerationRequest

        req = GenerationRequest(prompt_ids=list(prompt.ids), max_new_tokens=max_new_tokens,
                                spec=method, k=self.settings.k)
        done = None
        for event in self.runtime.generate(req):
            if isinstance(event, DoneEvent):
                done = event
        if done is None:
            raise SpeczooError(f"speczoo's runtime ended question {prompt.question_id} ({method}) without a "
                               "DoneEvent; this is a bug in the runtime")
        s = done.stats
        return PeerOutput(ids=list(done.ids), text=done.text, finish=done.finish_reason, seconds=s.seconds,
                          tokens=timed_tokens(len(done.ids), done.finish_reason),
                          total_seconds=s.seconds + s.prefill_seconds, timing="engine",
                          drafted=s.drafted, accepted=s.accepted)

    def close(self) -> None:
        self.runtime = None
        gc.collect()


# -- rows ------------------------------------------------------------------------------------------

def build_prompts(questions: list[Question], tokenizer) -> list[PeerPrompt]:
    """First turn of each question through the chat template, encoded once (no special tokens added)."""
    out = []
    for q in questions:
        text = tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}],
                                             add_generation_prompt=True)
        out.append(PeerPrompt(q.question_id, q.category, text, tokenizer.encode(text)))
    return out


def context_for(prompts: list[PeerPrompt], max_new_tokens: int, k: int) -> int:
    """A context every system can hold: longest prompt + new tokens + one draft + margin, to 64."""
    need = max(len(p.ids) for p in prompts) + max_new_tokens + k + 8
    return int(math.ceil(need / 64) * 64)


def judge(gen: PeerOutput, ref_row: dict | None, compare: str) -> tuple[bool | None, list[int] | None]:
    """(lossless, first mismatch [turn, position]) against the reference row; None without a reference."""
    if ref_row is None:
        return None, None
    if compare == "ids":
        mismatch = first_mismatch([gen.ids], [ref_row["ids"]])
        return mismatch is None, mismatch
    a, b = gen.text, ref_row["text"]
    if a == b or (ref_row["finish"] == "length" and a.startswith(b)):
        return True, None      # a tool that ran past the token limit may only add text after greedy's
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return False, [0, at]          # position in characters for a text comparison


def make_row(prompt: PeerPrompt, family: str, method: str, describe: str, gen: PeerOutput,
             settings: PeerSettings, reference: tuple[str, str] | None, ref_row: dict | None) -> dict:
    compare = reference[1] if reference else None
    lossless, mismatch = judge(gen, ref_row, compare) if reference else (None, None)
    return {
        "question_id": prompt.question_id, "category": prompt.category,
        "system": f"{family}:{method}", "family": family, "method": method, "describe": describe,
        "reference": reference[0] if reference else None, "compare": compare,
        "lossless": lossless, "first_mismatch": mismatch,
        "prompt_tokens": len(prompt.ids), "new_tokens": gen.new_tokens, "finish": gen.finish,
        "tokens": gen.tokens, "seconds": gen.seconds, "tok_s": report.tok_s(gen.tokens, gen.seconds),
        "total_seconds": gen.total_seconds, "timing": gen.timing,
        "drafted": gen.drafted, "accepted": gen.accepted,
        "target": settings.target, "target_gguf": str(settings.target_gguf), "draft": settings.draft,
        "threads": settings.threads, "max_new_tokens": settings.max_new_tokens, "k": settings.k,
        "ids": gen.ids, "text": gen.text,
    }


# -- the run ---------------------------------------------------------------------------------------

@dataclass
class PeersOutcome:
    out_dir: Path
    rows: list[dict]
    summary: PeersSummary
    notes: list[str] = field(default_factory=list)     # skipped families and why
    markdown: str = ""


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def schedule(methods: list[str], prompts: list[PeerPrompt], serial: bool,
             warm_up: bool) -> list[tuple[PeerPrompt, str, bool]]:
    """The family's calls in order, as (prompt, method, timed). Each method first answers the first prompt
    untimed (warm_up). Interleaved: every warm-up, then each prompt through every method. Serial (a
    family that runs one server per method and keeps one alive): a method's warm-up and all its prompts,
    then the next method; its reference method comes first, so a reference row is always there."""
    if serial:
        return [c for m in methods
                for c in ([(prompts[0], m, False)] if warm_up else []) + [(p, m, True) for p in prompts]]
    return ([(prompts[0], m, False) for m in methods] if warm_up else []) + [
        (p, m, True) for p in prompts for m in methods]


def run_peers(prompts: list[PeerPrompt], settings: PeerSettings, out_dir: str | Path,
              systems: dict[str, list[str] | None] | None = None, baseline: str = BASELINE,
              families: dict[str, PeerFamily] | None = None, quiet: bool = False) -> PeersOutcome:
    """Run every chosen family over every prompt; write OUT/peers.jsonl and OUT/peers.md.

    systems: family → methods (None: all), from `parse_systems`; families: ready family objects by
    name (tests pass fakes), else they are built from FAMILIES. A family that cannot run is skipped
    with a note; any other error stops the run (rows so far are in peers.jsonl).
    """
    if not prompts:
        raise ValueError("no questions to run: check --categories and --limit")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / ROWS_FILE
    rows_path.write_text("", encoding="utf-8")
    systems = systems if systems is not None else {f: None for f in FAMILIES}
    notes: list[str] = []
    rows: list[dict] = []
    by_key: dict[tuple[int, str], dict] = {}
    for name, wanted in systems.items():
        family = (families or {}).get(name)
        if family is None:
            missing = missing_modules(FAMILIES[name].requires)
            if missing:
                notes.append(missing_message(name, missing))
                _log(notes[-1], quiet)
                continue
            try:
                family = make_family(name, settings)
            except PeerError as exc:
                notes.append(f"{name}: skipped, {exc}")
                _log(notes[-1], quiet)
                continue
        methods = family.methods()
        if wanted is not None:
            unknown = [m for m in wanted if m not in methods]
            if unknown:
                raise ValueError(f"--systems: {name} has no method {', '.join(unknown)}; "
                                 f"it has {', '.join(methods)}")
            methods = [m for m in methods if m in wanted]
        try:
            _log(f"{name}: loading", quiet)
            family.open()
            serial = name in FAMILIES and FAMILIES[name].serial
            for p, m, timed in schedule(methods, prompts, serial, bool(settings.warmup and family.warm_up)):
                if not timed:          # first-call costs (page faults, packing, JIT) are not timed
                    family.generate(m, p, settings.warmup)
                    continue
                ref = family.reference(m)
                gen = family.generate(m, p, settings.max_new_tokens)
                ref_row = by_key.get((p.question_id, ref[0])) if ref else None
                row = make_row(p, name, m, family.describe(m), gen, settings, ref, ref_row)
                rows.append(row)
                by_key[(p.question_id, row["system"])] = row
                with open(rows_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                flag = "" if row["lossless"] is None else ("  lossless" if row["lossless"] else
                                                           f"  DIFFERS at {row['first_mismatch']}")
                _log(f"  {row['system']:<24} q{p.question_id} {p.category}: {gen.new_tokens} tokens, "
                     f"{row['tok_s']:.2f} tok/s{flag}", quiet)
        except PeerError as exc:
            notes.append(f"{name}: stopped, {exc}")
            _log(notes[-1], quiet)
        finally:
            family.close()
            gc.collect()
    if not rows:
        raise PeerError("no system ran: " + "; ".join(notes))
    summary = summarize(rows, categories_of(prompts), baseline)   # categories_of reads only .category
    if not any(r["system"] == baseline for r in rows):
        notes.append(f"the baseline {baseline} did not run, so the ratio columns are empty; pass "
                     "--baseline SYSTEM to compare against another system")
    all_notes = run_notes(settings, prompts) + notes
    md = render_markdown(summary, f"speczoo peers: {settings.target}", all_notes)
    (out_dir / REPORT_FILE).write_text(md, encoding="utf-8")
    return PeersOutcome(out_dir=out_dir, rows=rows, summary=summary, notes=notes, markdown=md)


def run_notes(settings: PeerSettings, prompts: list[PeerPrompt]) -> list[str]:
    draft = (f"draft {settings.draft} ({settings.draft_gguf})" if settings.draft
             else "no draft model (draft-model systems not run)")
    return [
        f"target {settings.target}: every system loads {settings.target_gguf} (HF dequantizes it to bf16)",
        draft,
        f"{len(prompts)} questions; first turn only, rendered through the target's chat template and "
        "encoded once by speczoo's tokenizer (the same ids go to every system)",
        f"greedy; at most {settings.max_new_tokens} new tokens, stop at EOS {settings.eos_ids}; "
        f"K = {settings.k}; {settings.threads} threads everywhere; context {settings.n_ctx}; each method "
        f"first answers the first question untimed ({settings.warmup} tokens of warm-up)",
        f"machine: {os.cpu_count()} logical CPUs; run at {time.strftime('%Y-%m-%d %H:%M')}",
    ] + ([f"vLLM ({settings.vllm_venv}) loads the GGUF's tensors dequantized to float32 in the Hugging Face "
          f"layout and computes in {settings.vllm_dtype}: not the same weights as the GGUF systems, so its "
          "equality is judged against its own greedy only"] if settings.vllm_venv else [])

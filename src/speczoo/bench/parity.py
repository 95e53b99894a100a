"""The parity gate: does our model compute what the GGUF means, and does the fast backend keep it?

Two comparisons on a few hundred real tokens (Python standard-library source by default):
  1. our fp32 path vs an independent reference, transformers loading the SAME GGUF in fp32: top-1
     agreement over positions where the reference's top-2 gap exceeds `tie_gap` must be 100%;
     near-ties are counted and shown apart; max |logit diff| is reported.
  2. the fast linear backend vs our fp32: top-1 agreement and perplexity on the same text.
plus the tokenizer parity of `speczoo.zoo.tokparity`: speczoo's ids == llama.cpp's (`llama-tokenize`, when
SPECZOO_LLAMA_BIN or PATH has it); without it, transformers' ids are shown as a proxy that does not fail
the gate, since transformers tokenizes some files otherwise than llama.cpp (Gemma's long space runs,
SmolLM2's digits).
Our model runs the text as a chunked prefill, so the KV-cache path (and gemma3's sliding window, when
the text is longer than the window) is what gets compared. transformers is an optional extra (`check`);
this module imports it lazily and never falls back silently when it is missing. The reference model
is freed before ours is built (memory is shared).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from speczoo.cache import KVCache
from speczoo.errors import SpeczooError
from speczoo.models.loader import build_model
from speczoo.zoo.gguf import gguf_model_args, iter_gguf_tensors, open_gguf

DEFAULT_TEXT_FILES = ("textwrap.py", "functools.py", "heapq.py", "bisect.py")


@dataclass
class ReferenceParity:
    positions: int
    decisive: int            # positions whose reference top-2 gap > tie_gap
    decisive_agree: int      # of those, where our top-1 == the reference's
    near_ties: int
    near_tie_agree: int
    max_abs_diff: float
    mean_abs_diff: float

    @property
    def passed(self) -> bool:
        return self.decisive_agree == self.decisive


@dataclass
class BackendParity:
    backend: str
    positions: int
    top1_agree: int
    ppl_fp32: float
    ppl_backend: float
    max_abs_diff: float

    @property
    def agreement(self) -> float:
        return self.top1_agree / self.positions

    @property
    def ppl_ratio(self) -> float:
        return self.ppl_backend / self.ppl_fp32


@dataclass
class ParityReport:
    model: str
    n_tokens: int
    reference: ReferenceParity | None = None
    fast: BackendParity | None = None
    tokenizer: str = "not run"
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def default_text() -> str:
    """Real text for the gate: a few standard-library modules of the running Python."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text() for name in DEFAULT_TEXT_FILES if (root / name).is_file()]
    if not parts:
        raise FileNotFoundError(f"none of {DEFAULT_TEXT_FILES} found under {root}; pass --text FILE")
    return "\n\n".join(parts)


def compare_to_reference(ours: Tensor, ref: Tensor, tie_gap: float) -> ReferenceParity:
    """ours, ref: [S, V] fp32 logits of the same tokens."""
    top2 = ref.topk(2, dim=-1).values                              # [S, 2]
    decisive = (top2[:, 0] - top2[:, 1]) > tie_gap                 # [S]
    agree = ours.argmax(-1) == ref.argmax(-1)                      # [S]
    diff = (ours - ref).abs()
    return ReferenceParity(
        positions=ref.shape[0], decisive=int(decisive.sum()), decisive_agree=int((agree & decisive).sum()),
        near_ties=int((~decisive).sum()), near_tie_agree=int((agree & ~decisive).sum()),
        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()))


def perplexity(logits: Tensor, tokens: Tensor) -> float:
    """exp(mean NLL) of tokens[1:] under logits[:-1]; logits [S, V], tokens [S]."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -logp.gather(1, tokens[1:, None]).mean()
    return float(math.exp(float(nll)))


def run_ours(model, tokens: Tensor, chunk: int) -> Tensor:
    """Logits [S, V] from a chunked prefill through the KV cache."""
    s = tokens.shape[0]
    cache = KVCache(model.args, s, extra=0)
    out = []
    with torch.inference_mode():
        for a in range(0, s, chunk):
            b = min(s, a + chunk)
            out.append(model(tokens[a:b], torch.arange(a, b), cache).logits)
    return torch.cat(out)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise SpeczooError("the parity gate needs transformers (and accelerate) as its independent reference: "
                           "pip install 'speczoo[check]' (or pass --no-reference)") from None
    transformers.logging.set_verbosity_error()
    return transformers


def resolve_model(model: str | Path) -> tuple[Path, Path | None]:
    """(source GGUF, bundle dir or None) for a .gguf path, a bundle directory or a pulled zoo name."""
    p = Path(model)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file {p} does not exist")
        return p, None
    from speczoo.zoo.bundle import find_bundle, source_gguf

    bundle = find_bundle(model)
    return source_gguf(bundle), bundle


def reference_logits(gguf_path: Path, tokens: Tensor) -> Tensor:
    """transformers' fp32 model of the GGUF on tokens [S] -> logits [S, V]; frees the model."""
    tr = _transformers()
    model = tr.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                    dtype=torch.float32)
    model.eval()
    with torch.inference_mode():
        logits = model(tokens[None]).logits[0].float().clone()           # [S, V]
    del model
    gc.collect()
    return logits


def tokenizer_check(gguf_path: Path, bundle: Path | None, reference, text: str) -> tuple[str, bool]:
    """speczoo's tokenizer (from the bundle, else from the GGUF) vs llama.cpp's when its llama-tokenize is
    found, else vs transformers' (`reference`, a proxy that never fails the gate), on the gate's text and a
    slice of the standard library. Returns (summary, passed)."""
    from speczoo.tokenizer import Tokenizer
    from speczoo.zoo.gguf_tokenizer import read_tokenizer
    from speczoo.zoo.tokparity import llama_reference, stdlib_texts, tokenizer_parity

    ours = Tokenizer.from_bundle(bundle) if bundle is not None else read_tokenizer(gguf_path)
    llama = llama_reference(gguf_path)
    result = tokenizer_parity(ours, gguf_path, [text] + stdlib_texts(min_chars=100_000), reference=llama or reference)
    if llama is not None:
        return f"vs llama.cpp: {result.summary()}", result.mismatching == 0
    return (f"vs transformers, a proxy (set SPECZOO_LLAMA_BIN to check against llama.cpp's llama-tokenize): "
            f"{result.summary()}"), True


def _build(gguf_path: Path, bundle: Path | None, backend: str, cache: dict):
    """Our model: loaded from the bundle when there is one (its fp32 weights rebuilt from its source), else
    built from the GGUF's tensors (kept in `cache` so that the fast backend reuses them)."""
    if bundle is not None:
        from speczoo.zoo.weights import load_model

        return load_model(bundle, backend)      # fp32: rebuilt from the bundle's source, as pulled
    if not cache:
        reader = open_gguf(gguf_path)
        cache["args"] = gguf_model_args(reader)
        cache["tensors"] = dict(iter_gguf_tensors(reader))
    return build_model(cache["args"], cache["tensors"], backend)


def run_parity(model: str | Path, *, n_tokens: int = 640, chunk: int = 128, tie_gap: float = 1e-3,
               fast_backend: str | None = None, reference: bool = True, text: str | None = None,
               min_agreement: float = 0.90, max_ppl_ratio: float = 1.08, log=print) -> ParityReport:
    """Run the whole gate on a .gguf path, a bundle directory or a pulled zoo name (whose bundle is what
    our side loads, while the reference loads the bundle's source GGUF). `log` receives progress lines."""
    from speczoo.kernels.backends import DEFAULT_FAST_BACKEND

    gguf_path, bundle = resolve_model(model)
    if fast_backend is None and bundle is not None:
        from speczoo.runtime import default_backend
        fast_backend = default_backend(bundle)
    fast_backend = fast_backend or DEFAULT_FAST_BACKEND
    text = text if text is not None else default_text()
    report = ParityReport(model=str(model), n_tokens=0)

    log(f"tokenizer: llama.cpp's (else transformers') tokenizer of {gguf_path.name} vs speczoo's")
    tr = _transformers()
    ref_tok = tr.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokens = torch.tensor(ref_tok(text).input_ids[:n_tokens], dtype=torch.long)       # [S]
    report.n_tokens = int(tokens.shape[0])
    report.tokenizer, ok = tokenizer_check(gguf_path, bundle, ref_tok, text)
    if not ok:
        report.failures.append("tokenizer: speczoo's ids differ from llama.cpp's")
    del ref_tok

    ref_logits = None
    if reference:
        log(f"reference: transformers fp32 on {gguf_path.name}, {report.n_tokens} tokens")
        ref_logits = reference_logits(gguf_path, tokens)

    held: dict = {}
    log(f"ours: fp32 from {bundle or gguf_path}, chunked prefill of {chunk}")
    ours = run_ours(_build(gguf_path, bundle, "fp32", held), tokens, chunk)
    if ref_logits is not None:
        report.reference = compare_to_reference(ours, ref_logits, tie_gap)
        del ref_logits
        if not report.reference.passed:
            r = report.reference
            report.failures.append(f"fp32 vs reference: top-1 differs at {r.decisive - r.decisive_agree} of "
                                   f"{r.decisive} positions with a top-2 gap > {tie_gap}")
    gc.collect()

    log(f"fast backend: {fast_backend}")
    fast = run_ours(_build(gguf_path, bundle, fast_backend, held), tokens, chunk)
    agree = int((fast.argmax(-1) == ours.argmax(-1)).sum())
    report.fast = BackendParity(backend=fast_backend, positions=report.n_tokens, top1_agree=agree,
                                ppl_fp32=perplexity(ours, tokens), ppl_backend=perplexity(fast, tokens),
                                max_abs_diff=float((fast - ours).abs().max()))
    f = report.fast
    if f.agreement < min_agreement:
        report.failures.append(f"{fast_backend} vs fp32: top-1 agreement {f.agreement:.2%} < {min_agreement:.0%}")
    if f.ppl_ratio > max_ppl_ratio:
        report.failures.append(f"{fast_backend} vs fp32: perplexity ratio {f.ppl_ratio:.4f} > {max_ppl_ratio}")
    return report


def format_report(r: ParityReport) -> str:
    lines = [f"parity of {r.model} on {r.n_tokens} tokens"]
    lines.append(f"  tokenizer: {r.tokenizer}")
    if r.reference is not None:
        x = r.reference
        lines.append(f"  fp32 vs transformers: top-1 {x.decisive_agree}/{x.decisive} decisive positions agree; "
                     f"near-ties {x.near_tie_agree}/{x.near_ties} agree; max |diff| {x.max_abs_diff:.3g}, "
                     f"mean {x.mean_abs_diff:.3g}")
    else:
        lines.append("  fp32 vs transformers: skipped (--no-reference)")
    if r.fast is not None:
        f = r.fast
        lines.append(f"  {f.backend} vs fp32: top-1 {f.top1_agree}/{f.positions} ({f.agreement:.2%}); perplexity "
                     f"{f.ppl_backend:.4f} vs {f.ppl_fp32:.4f} (x{f.ppl_ratio:.4f}); max |diff| {f.max_abs_diff:.3g}")
    lines.append("  PASS" if r.passed else "  FAIL: " + "; ".join(r.failures))
    return "\n".join(lines)

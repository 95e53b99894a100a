"""`speczoo check MODEL --ppl FILE`: is the loaded model faithful to its GGUF, as faithful as llama.cpp?

On the same ids of one text (llama-perplexity's protocol, speczoo.bench.ppl): the perplexity of the model
on its backend (the bundle's default, or the one asked for) with its KV cache of --kv-type, of the fp32
reference (fp32 KV too) (the GGUF dequantized,
speczoo's `fp32` backend), and the backend's top-1 agreement and KL divergence against that reference;
beside them llama.cpp's perplexity of the same GGUF and its own agreement with its own F32 reference
(speczoo.bench.ppl_llama), where llama.cpp's tools are found. The goals it checks (issue #28): the
backend's perplexity within 1% of llama.cpp's, and its top-1 agreement at least llama.cpp's.
The fp32 reference is built and freed before the backend's model (memory is shared); its log-probabilities
wait in a temporary file.
"""

from __future__ import annotations

import gc
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speczoo.bench.ppl import Chunks, PplScore, evaluate, make_chunks, model_logits
from speczoo.bench.ppl_llama import LlamaPpl, first_difference, find_llama_bin, llama_ids, llama_perplexity
from speczoo.context import DEFAULT_KV_TYPE, kv_dtype
from speczoo.errors import SpeczooError

MAX_PPL_RATIO = 1.01        # the backend's perplexity / llama.cpp's


@dataclass
class PplReport:
    model: str
    backend: str
    kv_type: str
    n_ctx: int
    chunks: int
    positions: int
    fp32: PplScore
    fast: PplScore
    llama: LlamaPpl | None = None
    llama_note: str = ""
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def text_of(path: Path) -> str:
    """The text as llama-perplexity reads `-f FILE`: the file less one trailing newline (with --no-escape)."""
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def _open(model: str, backend: str | None):
    """(source GGUF, tokenizer, build(backend) -> model, the backend to check) for a zoo name, a bundle
    directory or a .gguf file."""
    from speczoo.bench.parity import resolve_model
    from speczoo.kernels.backends import DEFAULT_FAST_BACKEND

    gguf, bundle = resolve_model(model)
    if bundle is not None:
        from speczoo.runtime import default_backend
        from speczoo.tokenizer import Tokenizer
        from speczoo.zoo.weights import load_model
        return gguf, Tokenizer.from_bundle(bundle), (lambda b: load_model(bundle, b)), backend or default_backend(bundle)
    from speczoo.models.loader import build_model
    from speczoo.zoo.gguf import gguf_model_args, iter_gguf_tensors, open_gguf
    from speczoo.zoo.gguf_tokenizer import read_tokenizer
    reader = open_gguf(gguf)
    args, tensors = gguf_model_args(reader), dict(iter_gguf_tensors(reader))
    return gguf, read_tokenizer(gguf), (lambda b: build_model(args, tensors, b)), backend or DEFAULT_FAST_BACKEND


def _check_llama_ids(bin_dir: Path, gguf: Path, text_file: Path, chunks: Chunks) -> None:
    """llama.cpp's ids of the text must be speczoo's over the chunks scored."""
    n = chunks.targets.numel()
    ours, theirs = chunks.targets.flatten().tolist(), llama_ids(bin_dir, gguf, text_file)[:n]
    at = first_difference(ours, theirs)
    if at is not None:
        raise SpeczooError(f"llama.cpp tokenizes the text differently from speczoo: the ids part at position "
                           f"{at} (speczoo {ours[at:at + 5]}, llama.cpp {theirs[at:at + 5]}), so the two "
                           f"perplexities would not be of the same ids; fix the tokenizer or use another text")


def run_ppl_check(model: str, text_file: Path, *, backend: str | None = None, n_ctx: int = 512,
                  n_chunks: int | None = None, llama_bin: str | None = None, llama: bool = True,
                  llama_repack: bool = False, kv_type: str = DEFAULT_KV_TYPE, log=print) -> PplReport:
    dtype = kv_dtype(kv_type)
    gguf, tok, build, backend = _open(model, backend)
    ids = tok.encode(text_of(text_file), add_special=True)
    chunks = make_chunks(ids, n_ctx, n_chunks, tok.bos_id if tok.add_bos else None)
    n = chunks.ids.shape[0]
    log(f"{n} chunks of {n_ctx} ids, {chunks.positions} positions scored")
    progress = lambda line: log(f"  {line}")      # noqa: E731

    with tempfile.TemporaryDirectory(prefix="speczoo-ppl-") as tmp:
        log("fp32 reference (the GGUF dequantized)")
        ref_score, ref = evaluate(model_logits(build("fp32")), chunks, keep=Path(tmp) / "reference.npy", log=progress)
        gc.collect()
        log(f"{backend} backend, KV {kv_type}")
        fast, _ = evaluate(model_logits(build(backend), dtype), chunks, ref, log=progress)
        del ref
        gc.collect()
    report = PplReport(model=model, backend=backend, kv_type=kv_type, n_ctx=n_ctx, chunks=n, positions=chunks.positions,
                       fp32=ref_score, fast=fast)

    bin_dir = find_llama_bin(llama_bin) if llama else None
    if not llama:
        report.llama_note = "llama.cpp: skipped (--no-llama)"
    elif bin_dir is None:
        report.llama_note = ("llama.cpp: not found (give --llama-bin DIR or set SPECZOO_LLAMA_BIN; "
                             "`bash benchmarks/build_llama.sh` builds it)")
    else:
        _check_llama_ids(bin_dir, gguf, text_file, chunks)
        report.llama = llama_perplexity(bin_dir, gguf, text_file, n_ctx, n, torch.get_num_threads(),
                                        repack=llama_repack, log=log)
        lp = report.llama
        if fast.ppl > lp.ppl * MAX_PPL_RATIO:
            report.failures.append(f"perplexity {fast.ppl:.4f} is more than {100 * (MAX_PPL_RATIO - 1):.0f}% above "
                                   f"llama.cpp's {lp.ppl:.4f}")
        if fast.agreement < lp.agreement:
            report.failures.append(f"top-1 agreement with the fp32 reference {fast.agreement:.4f} is below "
                                   f"llama.cpp's {lp.agreement:.4f}")
    return report


def format_ppl_report(r: PplReport) -> str:
    lines = [f"perplexity of {r.model}: {r.chunks} chunks of {r.n_ctx} ids, {r.positions} positions scored "
             "(llama-perplexity's protocol)",
             f"  {'':34} {'ppl':>9} {'vs its fp32':>12} {'top-1 vs fp32':>14} {'KL vs fp32':>11}",
             f"  {'speczoo fp32 (GGUF dequantized)':34} {r.fp32.ppl:9.4f} {'—':>12} {1.0:14.4f} {0.0:11.5f}",
             f"  {'speczoo ' + r.backend + ', KV ' + r.kv_type:34} {r.fast.ppl:9.4f} {100 * (r.fast.ppl / r.fp32.ppl - 1):+11.2f}% "
             f"{r.fast.agreement:14.4f} {r.fast.kl:11.5f}"]
    if r.llama is not None:
        lp = r.llama
        lines += [f"  {'llama.cpp F32 (GGUF dequantized)':34} {lp.ppl_ref:9.4f} {'—':>12} {1.0:14.4f} {0.0:11.5f}",
                  f"  {'llama.cpp, the GGUF':34} {lp.ppl:9.4f} {100 * (lp.ppl / lp.ppl_ref - 1):+11.2f}% "
                  f"{lp.agreement:14.4f} {lp.kl:11.5f}",
                  f"  speczoo {r.backend} / llama.cpp perplexity: x{r.fast.ppl / lp.ppl:.4f} (goal <= x{MAX_PPL_RATIO}); "
                  f"top-1 {r.fast.agreement:.4f} vs {lp.agreement:.4f} (goal >=)  [{lp.bin_dir}]"]
        lines.append("  PASS" if r.passed else "  FAIL: " + "; ".join(r.failures))
    else:
        lines.append(f"  {r.llama_note}")
    return "\n".join(lines)

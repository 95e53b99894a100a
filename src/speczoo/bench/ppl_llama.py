"""llama.cpp's side of `speczoo check MODEL --ppl FILE`: its perplexity on the same GGUF and text, and its
top-1 agreement with its own fp32 reference of that GGUF.

The binaries are found in a folder: `--llama-bin DIR`, else $SPECZOO_LLAMA_BIN, else the folder of a
`llama-perplexity` on PATH, else benchmarks/build_llama.sh's default (~/.cache/speczoo/peers/llama.cpp/
build/bin under SPECZOO_HOME). A folder that was named but lacks the tools is an error; none found at all
is None, and the caller says so. Three steps, each one llama.cpp tool:
  - `llama-tokenize --ids`: the ids llama.cpp makes of the text (read verbatim: --no-escape here and
    below, or llama.cpp would turn the text's backslash sequences into characters), which must equal speczoo's over the chunks
    scored (else the two perplexities are not of the same ids, and this module says where they part);
  - `llama-quantize --allow-requantize GGUF F32.gguf F32`: the GGUF dequantized, llama.cpp's fp32 reference;
    `llama-perplexity --kl-divergence-base` on it (its perplexity, and its log-probs kept in a file);
  - `llama-perplexity --kl-divergence` of the GGUF against that file: its perplexity (PPL(Q)), and "Same
    top p", the fraction of positions whose argmax equals the reference's.
llama-perplexity runs the protocol of speczoo.bench.ppl (chunks of -c ids, BOS first where the model adds
one, the second half scored) on the first --chunks chunks, with --no-repack unless `repack`: its plain
CPU path, the reference arithmetic of each GGUF type on every CPU (the repacked layouts are speed
variants of the same formats, and its AMX one crashes under KVM: SIGSEGV in ggml_backend_amx_mul_mat). The F32 file and the log-probs live in a
temporary folder, removed at the end. This module never imports torch or a speczoo model.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speczoo.errors import SpeczooError
from speczoo.paths import home

ENV = "SPECZOO_LLAMA_BIN"
TOOLS = ("llama-perplexity", "llama-tokenize", "llama-quantize")
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+)")
MEAN_PPL_Q = re.compile(r"Mean PPL\(Q\)\s*:\s*([\d.]+)")
MEAN_PPL_BASE = re.compile(r"Mean PPL\(base\)\s*:\s*([\d.]+)")
SAME_TOP = re.compile(r"Same top p:\s*([\d.]+)\s*±")
MEAN_KLD = re.compile(r"Mean\s+KLD:\s*([-\d.]+)")


@dataclass
class LlamaPpl:
    ppl: float             # the GGUF, by llama.cpp
    ppl_ref: float         # its F32 reference, by llama.cpp
    agreement: float       # top-1 agreement of the GGUF with the F32 reference ("Same top p")
    kl: float              # mean KL(reference || GGUF)
    bin_dir: Path


def default_bin_dir() -> Path:
    return home() / "peers" / "llama.cpp" / "build" / "bin"


def _has_tools(d: Path) -> bool:
    return all((d / t).is_file() for t in TOOLS)


def find_llama_bin(explicit: str | None = None) -> Path | None:
    """The folder holding llama.cpp's tools (see the module doc), or None when there is none."""
    for named, origin in ((explicit, "--llama-bin"), (os.environ.get(ENV), f"${ENV}")):
        if named:
            d = Path(named).expanduser()
            if not _has_tools(d):
                missing = [t for t in TOOLS if not (d / t).is_file()]
                raise SpeczooError(f"{origin} {named} lacks {missing}; build llama.cpp with "
                                   f"`bash benchmarks/build_llama.sh` and point {origin} at the folder it prints")
            return d
    on_path = shutil.which(TOOLS[0])
    for d in ([Path(on_path).parent] if on_path else []) + [default_bin_dir()]:
        if _has_tools(d):
            return d
    return None


def _run(cmd: list[str], what: str) -> str:
    """stdout + stderr of a llama.cpp tool; an error that shows its tail when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SpeczooError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{out[-2000:]}")
    return out


def _match(pattern: re.Pattern, text: str, what: str) -> float:
    m = pattern.search(text)
    if m is None:
        raise SpeczooError(f"llama-perplexity's output has no {what} (pattern {pattern.pattern!r}); its tail:\n"
                           f"{text[-1500:]}")
    return float(m.group(1))


def llama_ids(bin_dir: Path, gguf: Path, text_file: Path) -> list[int]:
    """llama.cpp's ids of the text with the model's special tokens (what llama-perplexity evaluates)."""
    out = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(gguf), "-f", str(text_file), "--ids",
                          "--no-escape", "--log-disable"], capture_output=True, text=True, errors="replace")
    if out.returncode != 0:
        raise SpeczooError(f"llama-tokenize failed (exit {out.returncode}): {out.stderr[-1500:]}")
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not (line.startswith("[") and line.endswith("]")):
        raise SpeczooError(f"llama-tokenize --ids printed no id list; its last line: {line[:200]!r}")
    return [int(v) for v in line[1:-1].split(",") if v.strip()]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (the shorter one's length when one is a prefix), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def llama_perplexity(bin_dir: Path, gguf: Path, text_file: Path, n_ctx: int, n_chunks: int, threads: int,
                     repack: bool = False, work: Path | None = None, log=print) -> LlamaPpl:
    """llama.cpp's perplexity of `gguf` and of its F32 reference on the first n_chunks chunks of n_ctx ids,
    and the agreement between the two (see the module doc)."""
    common = ["-c", str(n_ctx), "--chunks", str(n_chunks), "-b", str(n_ctx), "-t", str(threads), "--no-escape"]
    if not repack:
        common.append("--no-repack")
    with tempfile.TemporaryDirectory(prefix="speczoo-ppl-", dir=work) as tmp:
        f32, base = Path(tmp) / "reference-f32.gguf", Path(tmp) / "reference.kld"
        log(f"llama.cpp: dequantizing {gguf.name} to F32 (llama-quantize)")
        _run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(gguf), str(f32), "F32", str(threads)],
             "llama-quantize")
        log("llama.cpp: the F32 reference's perplexity and log-probs (llama-perplexity --kl-divergence-base)")
        ref_out = _run([str(bin_dir / "llama-perplexity"), "-m", str(f32), "-f", str(text_file), *common,
                        "--kl-divergence-base", str(base)], "llama-perplexity (F32 reference)")
        f32.unlink()
        log(f"llama.cpp: {gguf.name} against it (llama-perplexity --kl-divergence)")
        q_out = _run([str(bin_dir / "llama-perplexity"), "-m", str(gguf), *common, "--kl-divergence-base", str(base),
                      "--kl-divergence"], "llama-perplexity (the GGUF)")
    return LlamaPpl(ppl=_match(MEAN_PPL_Q, q_out, "Mean PPL(Q)"),
                    ppl_ref=_match(FINAL, ref_out, "final perplexity estimate"),
                    agreement=_match(SAME_TOP, q_out, "Same top p") / 100.0,
                    kl=_match(MEAN_KLD, q_out, "Mean KLD"), bin_dir=bin_dir)

"""Time `speczoo pull` on a GGUF of Llama-3.1-8B's shapes: does the pull scale to an 8B model?

    python -m benchmarks.pull_scale --dir /tmp/quant [--types Q4_K_M,Q8_0,F16] [--layers 32] [--keep]

For each type, writes a GGUF with random weights in Llama-3.1-8B's exact shapes (32 layers, hidden 4096,
32 heads / 8 KV heads of 128, FFN 14336, vocabulary 128256, an untied output) under the qwen2
architecture, which speczoo pulls today (the shapes and types set the pull's cost, not the architecture;
qwen2 adds 3 small biases per layer), then runs `SPECZOO_HOME=DIR/home speczoo pull FILE --quiet` and
reports its wall time, CPU time and peak memory (anonymous, and the GGUF's mapped pages apart). Q4_K_M is llama.cpp's mix (Q4_K everywhere but Q6_K
for the output and for attn_v / ffn_down in the layers its use_more_bits picks); Q8_0 and F16 are
uniform. Weights are random blocks of each type with sane scales, repeated every 256 rows (the pull's
cost does not depend on the values). The GGUF (5-16 GB) and the bundle are deleted afterwards unless
--keep. A measurement script: never imported by the package.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from speczoo.tokenizer import byte_alphabet
from speczoo.zoo.registry import local_bundle_name

T = gguf.GGMLQuantizationType
SHAPES = dict(layers=32, dim=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256)
F16_SCALES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,)}   # byte offsets of each block's fp16 scales
TILE_ROWS = 256


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose attn_v / ffn_down Q4_K_M keeps at Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_plan(kind: str, s: dict) -> list[tuple[str, tuple[int, int] | tuple[int], str]]:
    """(name, torch shape [out, in] or [n], GGUF type) of every tensor, in file order, for shapes `s`."""
    layers = s["layers"]
    d, kv = s["dim"], s["kv_heads"] * s["head_dim"]

    def lin(role: str, i: int | None = None) -> str:
        if kind != "Q4_K_M":
            return kind
        return "Q6_K" if role == "output" or (role in ("attn_v", "ffn_down") and _more_bits(i, layers)) else "Q4_K"

    bias = s.get("arch", "qwen2") == "qwen2"                  # qwen2's q/k/v biases; llama has none
    hd = s["heads"] * s["head_dim"]
    plan = [("token_embd.weight", (s["vocab"], d), lin("embd")), ("output_norm.weight", (d,), "F32")]
    if not s.get("tied"):
        plan.append(("output.weight", (s["vocab"], d), lin("output")))
    if "rope_factor" in s:                                    # Llama 3.1's per-frequency RoPE divisors
        plan.append(("rope_freqs.weight", (s["head_dim"] // 2,), "F32"))
    for i in range(layers):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (d,), "F32"),
                 (p + "attn_q.weight", (hd, d), lin("attn_q", i)), *([(p + "attn_q.bias", (hd,), "F32")] * bias),
                 (p + "attn_k.weight", (kv, d), lin("attn_k", i)), *([(p + "attn_k.bias", (kv,), "F32")] * bias),
                 (p + "attn_v.weight", (kv, d), lin("attn_v", i)), *([(p + "attn_v.bias", (kv,), "F32")] * bias),
                 (p + "attn_output.weight", (d, hd), lin("attn_output", i)),
                 (p + "ffn_norm.weight", (d,), "F32"),
                 (p + "ffn_gate.weight", (s["ffn"], d), lin("ffn_gate", i)),
                 (p + "ffn_up.weight", (s["ffn"], d), lin("ffn_up", i)),
                 (p + "ffn_down.weight", (d, s["ffn"]), lin("ffn_down", i))]
    return plan


def _tile(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    """TILE_ROWS random rows of `kind` with K inputs: fp32/fp16 values, or blocks with sane fp16 scales."""
    if kind in ("F32", "F16"):
        return (rng.standard_normal((TILE_ROWS, k)) / np.sqrt(k)).astype(np.float32 if kind == "F32" else np.float16)
    block, size = gguf.GGML_QUANT_SIZES[T[kind]]
    blocks = rng.integers(0, 256, (TILE_ROWS * k // block, size), dtype=np.uint8)
    scale = (rng.uniform(0.5, 1.5, blocks.shape[0]) * {"Q4_K": 2e-4, "Q6_K": 6e-4, "Q8_0": 1.5e-4}[kind])
    for at in F16_SCALES[kind]:
        blocks[:, at:at + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(TILE_ROWS, -1)


def _data(shape: tuple, kind: str, rng: np.random.Generator, tiles: dict) -> np.ndarray:
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    n, k = shape
    tile = tiles.setdefault((kind, k), _tile(kind, k, rng))
    return np.tile(tile, (n // TILE_ROWS + 1, 1))[:n]


def llama3_rope_factors(s: dict) -> np.ndarray:
    """rope_freqs of Llama 3.1's "llama3" RoPE scaling, as llama.cpp's converter writes them ([head_dim / 2]
    fp32 divisors): 1 for short wavelengths, `rope_factor` for long ones, smoothed between."""
    dim, factor, old = s["head_dim"], s["rope_factor"], s.get("rope_original_context", 8192)
    low, high = old / 1.0, old / 4.0                          # low_freq_factor 1, high_freq_factor 4
    wavelen = 2 * np.pi * s.get("rope_theta", 500_000.0) ** (np.arange(0, dim, 2) / dim)
    smooth = np.clip((old / wavelen - 1.0) / 3.0, 0.0, 1.0)
    out = 1.0 / ((1.0 - smooth) / factor + smooth)
    return np.where(wavelen < high, 1.0, np.where(wavelen > low, factor, out)).astype(np.float32)


LLAMA3_SPECIAL = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
                  128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
                  128009: "<|eot_id|>", 128010: "<|python_tag|>"}
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>"
                   "\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def _tokenizer(w: gguf.GGUFWriter, arch: str, vocab: int) -> None:
    """A byte-level BPE vocabulary of `vocab` tokens: the 256 byte symbols, fillers, then the special tokens
    (qwen2: two ChatML ones; llama: Llama 3's 256 at 128000, its BOS/EOS ids and chat template)."""
    tokens = [byte_alphabet()[b] for b in range(256)]
    if arch == "llama":
        n_special = 256                                       # the last 256 ids, as Llama 3's 128000-128255
        special = [LLAMA3_SPECIAL.get(128000 + i, f"<|reserved_special_token_{i}|>") for i in range(n_special)]
    else:
        special = ["<|endoftext|>", "<|im_end|>"]
    tokens += [f"x{i}" for i in range(vocab - len(tokens) - len(special))] + special
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe" if arch == "llama" else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - len(special)) + [3] * len(special))
    w.add_token_merges(["x 0"])
    if arch == "llama":
        w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
        w.add_eos_token_id(tokens.index("<|eot_id|>"))
        w.add_chat_template(LLAMA3_TEMPLATE)
    else:
        w.add_eos_token_id(len(tokens) - 1)


def write_gguf(path: Path, kind: str, shapes: dict = SHAPES) -> float:
    """Write a model of `shapes` (default Llama-3.1-8B's under qwen2) in `kind`; returns its size in bytes.

    `shapes` may also give arch ("qwen2", the default, or "llama": no q/k/v biases, Llama 3's tokenizer),
    tied (no output.weight), rope_factor (Llama 3.1's rope_freqs tensor; rope_theta, rope_original_context)
    and context (the context length; default 8192)."""
    rng = np.random.default_rng(0)
    s = shapes
    arch = s.get("arch", "qwen2")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_block_count(s["layers"])
    w.add_context_length(s.get("context", 8192))
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s.get("rope_theta", 500_000.0))
    w.add_layer_norm_rms_eps(1e-5)
    if arch == "llama":
        w.add_rope_dimension_count(s["head_dim"])
        w.add_vocab_size(s["vocab"])
    _tokenizer(w, arch, s["vocab"])
    plan = tensor_plan(kind, s)
    tiles: dict = {}
    fixed = {"rope_freqs.weight": llama3_rope_factors(s)} if "rope_factor" in s else {}

    def data(name: str, shape: tuple, t: str) -> np.ndarray:
        return fixed[name] if name in fixed else _data(shape, t, rng, tiles)

    for name, shape, t in plan:
        probe = data(name, shape, t)[:1] if len(shape) == 2 else data(name, shape, t)
        n = shape[0] if len(shape) == 2 else 1
        nbytes = probe.nbytes * n
        full_shape = (n, probe.shape[-1]) if len(shape) == 2 else probe.shape
        w.add_tensor_info(name, full_shape, probe.dtype, nbytes, raw_dtype=None if t in ("F32", "F16") else T[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, t in plan:
        w.write_tensor_data(data(name, shape, t))
    w.close()
    return path.stat().st_size


def _sample_memory(pid: int) -> tuple[dict[str, int], Callable[[], None]]:
    """The largest RssAnon and RssFile (bytes) of process `pid`, read from /proc every 0.2 s until the
    returned callable is called."""
    peak = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                return
            for line in lines:
                key, _, value = line.partition(":")
                if key in peak:
                    peak[key] = max(peak[key], int(value.split()[0]) * 1024)

    t = threading.Thread(target=sample, daemon=True)
    t.start()

    def stop() -> None:
        done.set()
        t.join()

    return peak, stop


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="where the GGUF and SPECZOO_HOME go (not the repo)")
    p.add_argument("--types", default="Q4_K_M,Q8_0,F16")
    p.add_argument("--layers", type=int, default=SHAPES["layers"])
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    home = args.dir / "home"
    for kind in args.types.split(","):
        path = args.dir / f"llama8b-shapes-{kind}.gguf"
        t0 = time.perf_counter()
        size = write_gguf(path, kind, dict(SHAPES, layers=args.layers))
        print(f"{kind}: wrote {path} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        run = subprocess.Popen([sys.executable, "-m", "speczoo.cli", "pull", "--quiet", "--force", str(path)],
                               env={**os.environ, "SPECZOO_HOME": str(home)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        peak, stop = _sample_memory(run.pid)
        out = run.communicate()[0]
        stop()
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(out, flush=True)
        bundle = home / "bundles" / local_bundle_name(path)
        on_disk = sum(f.stat().st_size for f in bundle.iterdir()) if bundle.is_dir() else 0
        print(f"{kind}: pull {'ok' if run.returncode == 0 else f'FAILED ({run.returncode})'}: wall {wall:.0f} s, "
              f"CPU {cpu:.0f} s, peak memory {peak['RssAnon'] / 1e9:.1f} GB anonymous + {peak['RssFile'] / 1e9:.1f} GB "
              f"of mapped file pages, bundle {on_disk / 1e9:.2f} GB; load average {load0:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end", flush=True)
        if not args.keep:
            path.unlink()
            shutil.rmtree(bundle, ignore_errors=True)


if __name__ == "__main__":
    main()

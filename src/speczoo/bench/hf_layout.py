"""A GGUF model rewritten in the Hugging Face layout (safetensors + config + tokenizer) for peers that load
only that layout, such as vLLM.

transformers reads the GGUF (`gguf_file=`), dequantizes every tensor and writes the folder with
`save_pretrained`: `config.json`, `generation_config.json`, `model.safetensors`, the tokenizer files,
and `speczoo-source.json` (the GGUF's path, sha256 and size, the precision, transformers' version). The
weights hold the GGUF's dequantized values: exactly in float32 (the default), rounded once more in
bfloat16. Either way the folder is not the GGUF a llama.cpp or speczoo run reads at its own precision:
a peer on this folder computes with the dequantized weights (in float32, or rounded to bfloat16), so its
numbers are not "same GGUF" numbers, and any report that uses them must say so.

The folder is written to a temporary directory beside it and renamed into place (a half-written one
never takes the final name); a folder whose `speczoo-source.json` matches the GGUF's sha256 and the
precision is reused. This module imports transformers lazily and never downloads anything.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speczoo import paths
from speczoo.errors import SpeczooError
from speczoo.zoo.source import sha256_file

SOURCE_FILE = "speczoo-source.json"
DTYPES = ("float32", "bfloat16")


class HFLayoutError(SpeczooError):
    """The GGUF cannot be written in the Hugging Face layout; says why and what to do."""


@dataclass
class HFLayout:
    path: Path                # the folder (config.json, model.safetensors, tokenizer files)
    source: Path              # the GGUF it was made from
    sha256: str               # of the GGUF
    dtype: str                # "float32" (the dequantized values exactly) or "bfloat16"
    reused: bool              # True when an existing folder matched and nothing was written


def default_dir(name: str, dtype: str = "float32") -> Path:
    """$SPECZOO_HOME/peers/hf/NAME-DTYPE: where `speczoo peers --vllm` keeps a model's HF layout."""
    return paths.home() / "peers" / "hf" / f"{name}-{dtype}"


def _matching(out_dir: Path, sha: str, dtype: str) -> bool:
    f = out_dir / SOURCE_FILE
    if not f.is_file() or not (out_dir / "config.json").is_file():
        return False
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("sha256") == sha and meta.get("dtype") == dtype


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise HFLayoutError(f"transformers cannot be imported ({exc}); the Hugging Face layout is written by "
                            "transformers: pip install -e '.[check]'") from None
    transformers.logging.set_verbosity_error()
    return transformers


def _dense(tr) -> dict:
    """from_pretrained's arguments that unpack every GGUF block into a plain dense model: transformers >= 5.24
    may otherwise keep the blocks packed (a quantized model, which save_pretrained refuses); older
    versions always unpack."""
    gguf_config = getattr(tr, "GgufConfig", None)
    return {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "float32", force: bool = False) -> HFLayout:
    """Write the GGUF at gguf_path in the Hugging Face layout to out_dir (atomically), or reuse a match."""
    import torch

    if dtype not in DTYPES:
        raise HFLayoutError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise HFLayoutError(f"GGUF file {gguf_path} does not exist")
    sha = sha256_file(gguf_path)
    if not force and _matching(out_dir, sha, dtype):
        return HFLayout(out_dir, gguf_path, sha, dtype, reused=True)
    tr = _transformers()
    try:
        model = tr.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                        dtype=getattr(torch, dtype), **_dense(tr))
        tokenizer = tr.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except ImportError as exc:     # transformers reads GGUF through the gguf package (and accelerate)
        raise HFLayoutError(f"transformers cannot read {gguf_path.name}: {exc}") from None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        meta = {"source": str(gguf_path), "sha256": sha, "size": gguf_path.stat().st_size, "dtype": dtype,
                "transformers": tr.__version__,
                "note": "the GGUF's tensors dequantized by transformers" + (
                    "" if dtype == "float32" else " and rounded to bfloat16")}
        (tmp / SOURCE_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        paths.replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HFLayout(out_dir, gguf_path, sha, dtype, reused=False)


def main(argv: list[str] | None = None) -> int:
    """python -m speczoo.bench.hf_layout MODEL [--out DIR] [--dtype float32|bfloat16] [--force]"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m speczoo.bench.hf_layout", description="Write a pulled zoo model's GGUF (or a GGUF path) in the Hugging Face layout.")
    p.add_argument("model", help="zoo name (pulled) or path of a .gguf file")
    p.add_argument("--out", type=Path, help="output folder (default $SPECZOO_HOME/peers/hf/NAME-DTYPE)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--force", action="store_true", help="write it again even when a matching folder exists")
    args = p.parse_args(argv)
    gguf_path, name = resolve_gguf(args.model)
    layout = convert_gguf(gguf_path, args.out or default_dir(name, args.dtype), args.dtype, args.force)
    print(f"{'reused' if layout.reused else 'wrote'} {layout.path} ({layout.dtype}, from {layout.source})")
    return 0


def resolve_gguf(model: str) -> tuple[Path, str]:
    """(GGUF path, name) of a zoo name or a .gguf path."""
    p = Path(model)
    if p.suffix == ".gguf":
        return p, p.stem
    from speczoo.zoo.bundle import find_bundle, source_gguf

    return source_gguf(find_bundle(model)), model


if __name__ == "__main__":
    raise SystemExit(main())

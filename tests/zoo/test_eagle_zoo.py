"""EAGLE heads as zoo entries: installed under SPECZOO_HOME/eagle, listed by `speczoo models`, chosen by
`--spec eagle:NAME` (or the newest for `eagle`), refused for a target they do not fit; a head packed
for a fast linear backend drafts like its fp32 self."""

import os
import time

import pytest
import torch

from speczoo import cli
from speczoo.cache import KVCache
from speczoo.errors import UnknownModelError
from speczoo.decoding.eagle.config import head_config_for
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.eagle.io import save_head
from speczoo.eagle_drafters import load_for, resolve_head
from speczoo.zoo.heads import install_head, list_heads
from tiny import tiny_model


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    return tmp_path


def make_head(args, name="tiny-target", seed=0, embed=None) -> EagleHead:
    cfg = head_config_for(name, args, draft_vocab=64)
    embed = torch.randn(args.vocab_size, args.dim) if embed is None else embed
    head = EagleHead(cfg, embed, seed=seed)
    head.set_vocab(torch.arange(64) * 2)
    return head


def install(home, head, name) -> None:
    src = save_head(head, home / "src" / name)
    install_head(src, name)


def test_heads_are_listed_and_resolved(home, capsys):
    model, args = tiny_model("qwen2")
    install(home, make_head(args), "tiny-eagle-a")
    time.sleep(0.01)
    install(home, make_head(args, seed=1), "tiny-eagle-b")
    os.utime(home / "home" / "eagle" / "tiny-eagle-a" / "model.safetensors", (1, 1))   # a is the older one
    assert [h.name for h in list_heads()] == ["tiny-eagle-a", "tiny-eagle-b"]
    assert resolve_head("tiny-target").name == "tiny-eagle-b"                     # the newest installed
    assert resolve_head("tiny-target", "tiny-eagle-a").name == "tiny-eagle-a"     # --spec eagle:tiny-eagle-a
    with pytest.raises(UnknownModelError, match="tiny-eagle-a"):
        resolve_head("tiny-target", "nope-eagle")
    assert resolve_head("other-target") is None                                   # none: no EAGLE mode offered
    assert cli.main(["models", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "tiny-eagle-b" in out and "eagle:tiny-eagle-b" in out


def test_install_needs_an_eagle_name(home):
    _, args = tiny_model("qwen2")
    src = save_head(make_head(args), home / "src" / "x")
    with pytest.raises(ValueError, match="eagle"):
        install_head(src, "my-head")


def test_a_head_for_another_target_is_refused(home):
    _, args = tiny_model("qwen2")
    install(home, make_head(args), "tiny-eagle")
    wider, _ = tiny_model("qwen2", n_layers=2, dim=32, n_heads=2, head_dim=16, n_kv_heads=1)
    with pytest.raises(ValueError, match="does not fit"):
        load_for(resolve_head("tiny-target"), wider, "tiny-target")


def test_q8_packed_head_follows_the_fp32_head():
    _, args = tiny_model("qwen2")
    ref = make_head(args)
    for p in ref.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    packed = make_head(args, embed=ref.embed)
    packed.load_state_dict(ref.state_dict())
    packed.pack("q8")
    feats, toks = torch.randn(6, 3 * args.dim), torch.randint(0, args.vocab_size, (6,))
    a = ref.step(toks, ref.fuse(feats), torch.arange(1, 7), KVCache(ref.kv_args(), 8))
    b = packed.step(toks, packed.fuse(feats), torch.arange(1, 7), KVCache(packed.kv_args(), 8))
    torch.testing.assert_close(b.logits, a.logits, atol=0.05, rtol=0.05)
    assert (b.logits.argmax(-1) == a.logits.argmax(-1)).float().mean() >= 5 / 6


def test_eagle_for_reads_the_head_name_of_a_spec():
    from speczoo.commands._model_args import eagle_for
    assert eagle_for("eagle:my-eagle") == "my-eagle" and eagle_for("eagle-tree:my-eagle") == "my-eagle"
    assert eagle_for("eagle") is None and eagle_for("draft:x") is None and eagle_for("auto") is None


def test_eagle_alpha_takes_one_prompt_source(capsys):
    from speczoo import cli
    for argv in (["--prompt", "hi", "--builtin", "free_form"], [], ["--builtin", "no-such-prompt"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["eagle-alpha", "qwen2.5-coder-1.5b", "--head", "h", *argv])
        assert e.value.code == 2
    assert "--builtin" in capsys.readouterr().err

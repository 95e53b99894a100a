"""The EAGLE-3 head: its inference steps agree with the training-time test, the speculators format
round-trips, and the draft vocabulary maps both ways."""

import json

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.decoding.eagle.config import HeadConfig, default_aux_layer_ids
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.eagle.io import load_head, save_head
from speczoo.training.eagle.ttt import unroll
from speczoo.training.eagle.vocab import draft_vocab, t2d_index

V, D = 96, 32


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def make_head(seed: int = 0, draft: int = 64) -> EagleHead:
    torch.manual_seed(seed)
    cfg = HeadConfig(target="tiny", hidden_size=D, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
                     target_vocab=V, draft_vocab=draft, aux_layer_ids=(1, 2, 3), rope_theta=10_000.0)
    head = EagleHead(cfg, torch.randn(V, D))
    for p in head.parameters():          # norms away from 1 so that a swapped tensor would show
        p.data.add_(0.05 * torch.randn_like(p))
    head.set_vocab(torch.randperm(V)[:draft].sort().values)
    return head


def test_steps_with_a_cache_equal_the_training_time_test():
    """Drafting j + 1 steps after committed row t reproduces the unrolled training logits of step j, row t
    (the draft fed the same input tokens as training does)."""
    head = make_head()
    L, steps = 12, 3
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, L, 3 * D, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    out = unroll(head, feats, ids, torch.zeros(1, L, dtype=torch.long), steps, keep_logits=True)
    for t in (0, 4, 7):
        cache = KVCache(head.kv_args(), 32)
        rows = torch.arange(t + 1)
        o = head.step(ids[0, rows + 1], head.fuse(feats[0, rows]), rows + 1, cache)   # committed rows 0..t
        torch.testing.assert_close(o.logits[-1], out.logits[0][0, t], atol=1e-5, rtol=1e-5)
        hid = o.hidden[-1:]
        for j in range(1, steps):
            o = head.step(ids[0, t + 1 + j:t + 2 + j], hid, torch.tensor([t + 1 + j]), cache)
            torch.testing.assert_close(o.logits[0], out.logits[j][0, t], atol=1e-5, rtol=1e-5)
            hid = o.hidden


def test_tree_mask_rows_equal_their_chains():
    """Two sibling rows in one step with a tree mask equal each run alone after the prefix."""
    head = make_head()
    feats = torch.randn(5, 3 * D)
    toks = torch.randint(0, V, (6,))
    base = KVCache(head.kv_args(), 32)
    o = head.step(toks[1:6], head.fuse(feats), torch.arange(1, 6), base)
    h = o.hidden[-1:]
    siblings = torch.tensor([3, 7])
    mask = torch.cat((torch.ones(2, 5, dtype=torch.bool), torch.eye(2, dtype=torch.bool)), dim=1)
    both = head.step(siblings, h.expand(2, D), torch.tensor([6, 6]), base, mask=mask)
    for i in range(2):
        c = KVCache(head.kv_args(), 32)
        head.step(toks[1:6], head.fuse(feats), torch.arange(1, 6), c)
        alone = head.step(siblings[i:i + 1], h, torch.tensor([6]), c)
        torch.testing.assert_close(both.logits[i], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_speculators_round_trip(tmp_path):
    head = make_head()
    save_head(head, tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["draft_vocab_size"] == 64 and cfg["transformer_layer_config"]["vocab_size"] == V
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    from safetensors import safe_open
    with safe_open(str(tmp_path / "h" / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.hidden_norm.weight",
            "layers.0.input_layernorm.weight", "layers.0.mlp.down_proj.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names
    assert "embed_tokens.weight" not in names                     # the target's table, never stored
    back = load_head(tmp_path / "h", head.embed)
    assert back.cfg == head.cfg
    for k, v in head.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    feats = torch.randn(4, 3 * D)
    a = head.step(torch.tensor([1, 2, 3, 4]), head.fuse(feats), torch.arange(1, 5), KVCache(head.kv_args(), 8))
    b = back.step(torch.tensor([1, 2, 3, 4]), back.fuse(feats), torch.arange(1, 5), KVCache(back.kv_args(), 8))
    assert torch.equal(a.logits, b.logits)


def test_a_full_vocabulary_head_stores_no_vocabulary_map(tmp_path):
    """Draft vocabulary = the target's: no d2t / t2d in the file (vLLM has nowhere to load them and refuses
    it), and loading restores the identity map."""
    head = make_head(draft=V)
    save_head(head, tmp_path / "h")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "h" / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "d2t" not in names and "t2d" not in names and "lm_head.weight" in names
    back = load_head(tmp_path / "h", head.embed)
    assert torch.equal(back.d2t, torch.zeros(V, dtype=torch.long)) and bool(back.t2d.all())
    for k, v in head.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_load_refuses_another_target(tmp_path):
    head = make_head()
    save_head(head, tmp_path / "h")
    with pytest.raises(ValueError, match="another target"):
        load_head(tmp_path / "h", torch.randn(V + 1, D))


def test_vocab_maps():
    counts = torch.tensor([5, 0, 9, 9, 1, 0, 3, 2])
    ids = draft_vocab(counts, 4, always=[5])
    assert ids.tolist() == [0, 2, 3, 5]          # 9, 9, 5 most frequent; 5 forced in over 6 (3)
    head = make_head(draft=4)
    head.set_vocab(torch.tensor([1, 10, 40, 95]))
    assert head.draft_to_target[torch.arange(4)].tolist() == [1, 10, 40, 95]
    assert head.t2d.nonzero().flatten().tolist() == [1, 10, 40, 95]
    idx = t2d_index(torch.tensor([1, 10, 40, 95]), V)
    assert idx[torch.tensor([1, 40, 2])].tolist() == [0, 2, -100]


def test_default_layers_follow_vllm():
    assert default_aux_layer_ids(28) == (2, 14, 25)
    assert default_aux_layer_ids(3) == (1, 1, 2)
    with pytest.raises(ValueError):
        default_aux_layer_ids(1)

"""Model contract on tiny random models of every architecture: shapes, cache paths (decode, rollback,
compact, token trees), the sliding window, hidden states, batch invariance, and the loader."""

import json
from dataclasses import asdict, replace

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from speczoo.cache import KVCache
from speczoo.kernels import backends, linear
from speczoo.kernels.attention import KeyRows
from speczoo.models import base
from speczoo.models.forward import LAST_ROW, Packed, Readout, Tree
from speczoo.models.loader import build_model, linear_weight_sources, load_model
from hand_tree import PARENT, tree_inputs, tree_paths
from real_models import BY_ARCH
from tiny import ARCHS, tiny_args, tiny_model, tiny_tensors

INVARIANT = "fp32-rows"


def toks(n, seed=1, vocab=128):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def full(model, args, tokens):
    c = KVCache(args, 64)
    return model(tokens, torch.arange(len(tokens)), c).logits


def assert_close(a, b):
    assert a.shape == b.shape
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes_and_hidden(arch):
    model, args = tiny_model(arch)
    c = KVCache(args, 32)
    out = model(toks(7), torch.arange(7), c, readout=Readout(hidden_layers=[0, -1, 1]))
    assert out.logits.shape == (7, args.vocab_size) and out.logits.dtype == torch.float32
    assert [h.shape for h in out.hidden] == [(7, args.dim)] * 3
    assert c.length == 7
    assert model(toks(2), torch.arange(7, 9), c).hidden == []
    assert c.length == 9
    with pytest.raises(ValueError, match="out of range"):
        model(toks(1), torch.tensor([9]), c, readout=Readout(hidden_layers=[args.n_layers]))
    assert c.length == 9


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_is_residual_stream_after_layer(arch):
    model, args = tiny_model(arch)
    t = toks(6)
    out = model(t, torch.arange(6), KVCache(args, 16), readout=Readout(hidden_layers=[0, args.n_layers - 1]))
    one, a1 = tiny_model(arch, n_layers=1)           # same seed: same first-layer weights
    first = one(t, torch.arange(6), KVCache(a1, 16), readout=Readout(hidden_layers=[0]))
    torch.testing.assert_close(out.hidden[0], first.hidden[0], atol=1e-6, rtol=1e-6)
    # the last hidden state through the final norm and the LM head (and gemma2's final soft-cap) gives the logits
    want = model.lm_head(model.norm(out.hidden[1]))
    if args.final_logit_softcap > 0:
        want = torch.tanh(want / args.final_logit_softcap) * args.final_logit_softcap
    torch.testing.assert_close(want, out.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fp32", INVARIANT])
def test_cached_decode_equals_full_forward(arch, backend):
    model, args = tiny_model(arch, backend=backend)
    t = toks(20)                      # longer than gemma3's tiny window (6)
    ref = full(model, args, t)
    c = KVCache(args, 32)
    steps = [model(t[i:i + 1], torch.tensor([i]), c).logits for i in range(20)]
    got = torch.cat(steps)
    if backend == INVARIANT:
        assert torch.equal(got, ref)
    else:
        assert_close(got, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_invariant_and_batched_attention_agree(arch):
    model, args = tiny_model(arch)
    t = toks(19)
    batched = full(model, args, t)
    model.invariant = True
    assert_close(full(model, args, t), batched)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fp32", INVARIANT])
def test_rollback_equals_recompute(arch, backend):
    model, args = tiny_model(arch, backend=backend)
    t = toks(16)
    c = KVCache(args, 32)
    model(t[:10], torch.arange(10), c)
    model(toks(5, seed=7), torch.arange(10, 15), c)     # a rejected verify
    c.truncate(10)
    got = model(t[10:16], torch.arange(10, 16), c).logits
    ref = full(model, args, t)[10:16]
    if backend == INVARIANT:
        assert torch.equal(got, ref)
    else:
        assert_close(got, ref)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fp32", INVARIANT])
def test_tree_rows_equal_linear_forward_of_each_path(arch, backend):
    model, args = tiny_model(arch, backend=backend)
    prefix = toks(9)              # beyond gemma3's tiny window (6) once the tree is added
    c = KVCache(args, 32)
    model(prefix, torch.arange(9), c)
    tokens, positions, mask = tree_inputs(9)
    tree = model(tokens, positions, c, attend=Tree(mask)).logits
    assert c.length == 9 + len(PARENT)
    for i, path in enumerate(tree_paths()):
        seq = torch.cat([prefix, tokens[path]])
        if backend == INVARIANT:
            # sequential decode of the path (exactly what plain greedy would compute)
            d = KVCache(args, 32)
            model(prefix, torch.arange(9), d)
            for j, node in enumerate(path):
                last = model(tokens[node:node + 1], torch.tensor([9 + j]), d).logits[0]
            assert torch.equal(tree[i], last), f"tree row {i} (path {path})"
        else:
            assert_close(tree[i:i + 1], full(model, args, seq)[-1:])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fp32", INVARIANT])
def test_compact_equals_recompute(arch, backend):
    model, args = tiny_model(arch, backend=backend)
    prefix = toks(9)
    c = KVCache(args, 32)
    model(prefix, torch.arange(9), c)
    tokens, positions, mask = tree_inputs(9)
    model(tokens, positions, c, attend=Tree(mask))
    accepted = tree_paths()[5]                       # [0, 2, 4, 5]: not the first branch
    c.compact([9 + n for n in accepted], 9)
    c.truncate(9 + len(accepted))
    nxt = toks(3, seed=5)
    got = model(nxt, torch.arange(9 + len(accepted), 12 + len(accepted)), c).logits
    seq = torch.cat([prefix, tokens[accepted], nxt])
    ref = full(model, args, seq)[-3:]
    if backend == INVARIANT:
        assert torch.equal(got, ref)
    else:
        assert_close(got, ref)


def test_tree_mask_must_include_the_diagonal():
    model, args = tiny_model("qwen2")
    c = KVCache(args, 16)
    with pytest.raises(ValueError, match="diagonal"):
        model(toks(3), torch.arange(3), c, attend=Tree(torch.zeros(3, 3, dtype=torch.bool)))
    assert c.length == 0


def test_a_wrong_combination_of_forward_options_cannot_be_built():
    """How the rows attend is one value (Chain, Tree or Packed), so a tree mask with packed keys, or cache
    slots (dest) without the keys they go with, cannot be written; each value refuses bad parts when it is
    built, and the forward refuses one that does not fit its tokens or cache, before writing anything."""
    model, args = tiny_model("qwen2", backend=INVARIANT)
    c = KVCache(args, 8)
    keys = KeyRows.from_rows([(0, 1), (0, 2)])
    with pytest.raises(TypeError, match="tree_mask"):          # the old loose keywords are gone
        model(toks(2), torch.arange(2), c, tree_mask=torch.ones(2, 2, dtype=torch.bool), keys=keys)
    with pytest.raises(TypeError, match="dest"):               # packed rows need their cache slots
        Packed(keys)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="square"):
        Tree(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        Tree(torch.eye(2))
    with pytest.raises(ValueError, match="one per row"):
        Packed(keys, torch.tensor([0]))
    with pytest.raises(ValueError, match="int64"):
        Packed(keys, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match=">= 0"):
        Packed(keys, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="logit_rows"):
        Readout(logit_rows=[0, 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden_layers"):
        Readout(hidden_layers=[0.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="for 3 tokens"):
        model(toks(3), torch.arange(3), c, attend=Tree(torch.ones(2, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match=rf"\[0, {c.capacity}\)"):
        model(toks(2), torch.arange(2), c, attend=Packed(keys, torch.tensor([0, c.capacity])))
    assert c.length == 0 and not c._k.any()
    assert Readout(hidden_layers=[0, -1]).hidden_layers == (0, -1)


@pytest.mark.parametrize("invariant", [False, True])
def test_sliding_window_hides_keys_beyond_the_window(invariant):
    # one sliding layer: the logits at position p depend only on tokens p-W+1 .. p
    w = 4
    model, args = tiny_model("gemma3", n_layers=1, sliding_window=w, sliding_pattern=100)
    assert args.layer_is_sliding(0)
    model.invariant = invariant
    a = toks(10)
    b = a.clone()
    b[2] = (b[2] + 1) % args.vocab_size
    la, lb = full(model, args, a), full(model, args, b)
    assert torch.equal(la[2 + w:], lb[2 + w:])                 # token 2 is out of every later window
    assert not torch.allclose(la[2:2 + w], lb[2:2 + w])        # ... but inside these
    # a global layer (pattern 1: every layer global) sees it everywhere
    glob, gargs = tiny_model("gemma3", n_layers=1, sliding_window=w, sliding_pattern=1)
    assert not gargs.layer_is_sliding(0)
    assert not torch.allclose(full(glob, gargs, a)[-1], full(glob, gargs, b)[-1])


@pytest.mark.parametrize("backend", [INVARIANT, "q4", "q8", "f16", "bf16w"])  # compiled blocks where the shape allows
@pytest.mark.parametrize("arch", ARCHS)
def test_batch_invariance_across_forward_sizes(arch, backend):
    model, args = tiny_model(arch, backend=backend)
    t = toks(40)
    c = KVCache(args, 64)
    whole = model(t, torch.arange(40), c, readout=Readout(hidden_layers=[1]))          # one prefill of 40 rows
    for sizes in ([1] * 7 + [2, 5, 9, 17], [17, 9, 5, 2, 1, 1, 1, 1, 1, 1, 1]):
        c = KVCache(args, 64)
        logits, hidden, at = [], [], 0
        for s in sizes:
            out = model(t[at:at + s], torch.arange(at, at + s), c, readout=Readout(hidden_layers=[1]))
            logits.append(out.logits)
            hidden.append(out.hidden[0])
            at += s
        assert at == 40
        assert torch.equal(torch.cat(logits), whole.logits), sizes
        assert torch.equal(torch.cat(hidden), whole.hidden[0]), sizes


@pytest.mark.parametrize("backend", [INVARIANT, "q8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_long_prefill_runs_in_chunks_to_the_same_bits(arch, backend, monkeypatch):
    """A chain of more than PREFILL_ROWS rows runs that many at a time (bounded kernel scratch): the same
    logits, hidden states and cache, bit for bit, as one forward of every row; a tree never splits."""
    model, args = tiny_model(arch, backend=backend)
    t = toks(40)
    readout = Readout(hidden_layers=[1, -1])
    whole_cache = KVCache(args, 64)
    whole = model(t, torch.arange(40), whole_cache, readout=readout)
    calls = []
    run = model._run_layers
    monkeypatch.setattr(model, "_run_layers", lambda tokens, *a: calls.append(len(tokens)) or run(tokens, *a))
    monkeypatch.setattr(base, "PREFILL_ROWS", 16)
    c = KVCache(args, 64)
    model(t[:3], torch.arange(3), c)                                 # a prefix already in the cache
    calls.clear()
    out = model(t[3:], torch.arange(3, 40), c, readout=readout)
    assert calls == [16, 16, 5] and c.length == 40
    ref = model(t[:3], torch.arange(3), KVCache(args, 64))
    assert torch.equal(torch.cat((ref.logits, out.logits)), whole.logits)
    for k in range(2):
        assert torch.equal(out.hidden[k], whole.hidden[k][3:])
    assert torch.equal(c._k[:, :, :40], whole_cache._k[:, :, :40]) and torch.equal(c._v[:, :, :40], whole_cache._v[:, :, :40])
    calls.clear()
    tree = Tree(torch.ones(20, 20, dtype=torch.bool).tril())
    model(t[:20], torch.arange(40, 60), c, attend=tree)
    assert calls == [20]


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_rows_selects_rows(arch):
    model, args = tiny_model(arch)
    t = toks(8)
    ref = full(model, args, t)
    c = KVCache(args, 16)
    last = model(t, torch.arange(8), c, readout=LAST_ROW).logits
    assert last.shape == (1, args.vocab_size) and c.length == 8
    torch.testing.assert_close(last, ref[-1:])


@pytest.mark.parametrize("arch", ARCHS)
def test_untied_head_uses_output_weight(arch):
    tied, args = tiny_model(arch)
    untied, uargs = tiny_model(arch, tie_embeddings=False)
    t = toks(4)
    assert not torch.allclose(full(tied, args, t), full(untied, uargs, t))
    torch.testing.assert_close(untied.lm_head.weight, tiny_tensors(uargs, 0, tied=False)["output.weight"])


class _StoredScaled(linear.LinearBackend):
    """A stored backend for tests: weight / 2 and a scale of 2, kept in the bundle."""
    name = "test-stored-models"
    stored = True

    def pack(self, weight):
        return {"half": weight / 2, "scale": torch.tensor([2.0])}

    def build(self, packed, bias):
        return linear.Fp32Linear(packed["half"] * packed["scale"], bias)


def write_bundle(path, args, tensors):
    args_json = asdict(args)
    (path / "config.json").write_text(json.dumps(args_json))
    save_file({k: v.contiguous() for k, v in tensors.items()}, path / "weights.safetensors")


@pytest.mark.parametrize("arch", ARCHS)
def test_load_model_from_bundle_with_and_without_stored_packing(arch, tmp_path):
    if _StoredScaled.name not in backends.BACKENDS:
        backends.register(_StoredScaled())
    args = tiny_args(arch)
    tensors = tiny_tensors(args, seed=3)
    write_bundle(tmp_path, args, tensors)
    t = toks(6)
    ref = full(build_model(args, tensors, "fp32"), args, t)
    loaded = load_model(tmp_path, "fp32")
    assert isinstance(loaded, nn.Module) and loaded.args == args
    assert torch.equal(full(loaded, args, t), ref)
    with pytest.raises(FileNotFoundError, match="weights-test-stored-models"):
        load_model(tmp_path, "test-stored-models")
    backend = backends.get_backend("test-stored-models")
    packed = {}
    for packed_name, source in linear_weight_sources(tensors).items():
        for part, x in backend.pack(tensors[source]).items():
            packed[f"{packed_name}.{part}"] = x
    assert "output.weight.half" in packed            # tied head packed under output.weight
    save_file(packed, tmp_path / "weights-test-stored-models.safetensors")
    torch.testing.assert_close(full(load_model(tmp_path, "test-stored-models"), args, t), ref)
    for layout in ("2", "1"):                         # stamped by this speczoo, or by an older one
        save_file(packed, tmp_path / "weights-test-stored-models.safetensors", metadata={"layout": layout})
        torch.testing.assert_close(full(load_model(tmp_path, "test-stored-models"), args, t), ref)
    for layout in ("3", "q4"):                        # a newer layout, or one that is not ours: refused
        save_file(packed, tmp_path / "weights-test-stored-models.safetensors", metadata={"layout": layout})
        with pytest.raises(ValueError, match="reads layouts 1..2"):
            load_model(tmp_path, "test-stored-models")


def test_unknown_arch_and_backend_are_errors():
    args = replace(tiny_args("qwen2"), arch="mamba")
    with pytest.raises(ValueError, match="'mamba' is not supported; speczoo runs qwen2, qwen3, llama, phi3"):
        build_model(args, {}, "fp32")
    with pytest.raises(ValueError, match="unknown linear backend"):
        tiny_model("qwen2", backend="nope")


@pytest.mark.real
@pytest.mark.parametrize("arch", sorted(BY_ARCH))
def test_real_model_is_batch_invariant_with_the_fast_backend(arch):
    """The real model with its fast backend: a prefill, chunked verifies and single decode
    steps give bit-identical logits, and a token tree's rows equal sequential decode of their paths."""
    from speczoo.kernels.backends import get_backend
    from speczoo.runtime import load

    loaded = load(BY_ARCH[arch])      # the pulled bundle with the fast backend it was packed for
    assert get_backend(loaded.backend).batch_invariant, \
        f"the fast backend {loaded.backend!r} must be batch-invariant: exactness depends on it"
    args, model = loaded.args, loaded.model
    assert model.invariant
    t = torch.tensor([(i * 7919) % 5000 + 100 for i in range(24)])
    with torch.inference_mode():
        whole = model(t, torch.arange(24), KVCache(args, 64)).logits
        c = KVCache(args, 64)
        parts, at = [], 0
        for s in (1, 1, 5, 9, 2, 1, 5):
            parts.append(model(t[at:at + s], torch.arange(at, at + s), c).logits)
            at += s
        assert torch.equal(torch.cat(parts), whole)
        tokens, positions, mask = tree_inputs(24)
        c.truncate(24)
        tree = model(tokens, positions, c, attend=Tree(mask)).logits
        for i, path_nodes in enumerate(tree_paths()):
            c.truncate(24)
            for j, node in enumerate(path_nodes):
                last = model(tokens[node:node + 1], torch.tensor([24 + j]), c).logits[0]
            assert torch.equal(tree[i], last), f"tree row {i}"

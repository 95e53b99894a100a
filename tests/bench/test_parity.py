"""The parity gate: its statistics on hand-made logits, and (real) the gate itself and the real models'
exactness properties (tree rows == sequential decode, bit for bit, with a batch-invariant backend)."""

import pytest
import torch

from speczoo.bench.parity import (ParityReport, ReferenceParity, compare_to_reference, format_report,
                                  perplexity, run_ours)
from speczoo.cache import KVCache
from speczoo.models.forward import Tree
from speczoo.models.loader import build_model
from speczoo.zoo.gguf import gguf_model_args, iter_gguf_tensors, open_gguf
from real_models import GEMMA_NAME, QWEN_NAME, gguf_of
from tiny import tiny_model



def test_compare_separates_decisive_positions_from_near_ties():
    ref = torch.tensor([[5.0, 1.0, 0.0],      # decisive, we agree
                        [2.0, 2.0005, 0.0],   # near-tie (gap 5e-4), we disagree
                        [0.0, 3.0, 1.0],      # decisive, we disagree
                        [1.0, 0.0, 0.0]])     # decisive, we agree
    ours = ref.clone()
    ours[1] = torch.tensor([2.1, 2.0, 0.0])
    ours[2] = torch.tensor([3.5, 3.0, 1.0])
    r = compare_to_reference(ours, ref, tie_gap=1e-3)
    assert (r.positions, r.decisive, r.decisive_agree, r.near_ties, r.near_tie_agree) == (4, 3, 2, 1, 0)
    assert not r.passed
    assert r.max_abs_diff == pytest.approx(3.5)
    ours[2] = ref[2]
    assert compare_to_reference(ours, ref, 1e-3).passed       # a near-tie disagreement does not fail


def test_perplexity_of_a_known_distribution():
    tokens = torch.tensor([0, 1, 2, 3])
    uniform = torch.zeros(4, 8)
    assert perplexity(uniform, tokens) == pytest.approx(8.0)
    sure = torch.full((4, 8), -1e4)
    sure[0, 1] = sure[1, 2] = sure[2, 3] = 0.0
    assert perplexity(sure, tokens) == pytest.approx(1.0)


def test_run_ours_chunked_equals_one_prefill():
    model, args = tiny_model("gemma3")
    t = torch.arange(20) % args.vocab_size
    one = model(t, torch.arange(20), KVCache(args, 20)).logits
    torch.testing.assert_close(run_ours(model, t, chunk=7), one, atol=2e-5, rtol=1e-5)


def test_report_says_pass_or_fail():
    r = ParityReport(model="m", n_tokens=3,
                     reference=ReferenceParity(3, 3, 3, 0, 0, 1e-5, 1e-6), tokenizer="identical")
    assert r.passed and format_report(r).endswith("PASS")
    r.failures.append("fp32 vs reference: top-1 differs")
    assert not r.passed and "FAIL" in format_report(r)


@pytest.mark.real
def test_real_tree_rows_are_bit_identical_to_sequential_decode():
    """On the real 0.5B (sizes where BLAS picks real kernels) with the invariant test backend."""
    import tiny  # noqa: F401  registers fp32-rows

    r = open_gguf(gguf_of(QWEN_NAME))
    args = gguf_model_args(r)
    tensors = dict(iter_gguf_tensors(r))
    model = build_model(args, tensors, "fp32-rows")
    prefix = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3)          # 36 tokens
    parent = [-1, 0, 0, 1, 3]
    node_tokens = torch.tensor([13, 14, 15, 16, 17])
    paths = []
    for i in range(len(parent)):
        p, n = [], i
        while n >= 0:
            p.append(n)
            n = parent[n]
        paths.append(p[::-1])
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i, p in enumerate(paths):
        mask[i, p] = True
    positions = torch.tensor([36 + len(p) - 1 for p in paths])
    with torch.inference_mode():
        c = KVCache(args, 64)
        model(prefix, torch.arange(36), c)
        seq = []
        for p in paths:                  # sequential decode of each path, rolling back to the prefix
            c.truncate(36)
            for j, node in enumerate(p):
                last = model(node_tokens[node:node + 1], torch.tensor([36 + j]), c).logits[0]
            seq.append(last)
        c.truncate(36)
        tree = model(node_tokens, positions, c, attend=Tree(mask)).logits
    for i in range(len(paths)):
        assert torch.equal(tree[i], seq[i]), f"tree row {i}"


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", [QWEN_NAME, GEMMA_NAME])
def test_real_parity_gate(name):
    pytest.importorskip("transformers", reason="the parity reference needs transformers (speczoo[check])")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")
    from speczoo.bench.parity import run_parity

    report = run_parity(name, n_tokens=600, log=lambda line: None)
    assert report.reference is not None and report.reference.decisive >= 500
    assert report.passed, format_report(report)
    assert report.reference.max_abs_diff < 1e-3

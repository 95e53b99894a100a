"""The encoded embedding: rows looked up in an unpacked.safetensors embedding kept in its GGUF blocks (or a
narrower float dtype) are bit for bit the rows of the full decode, for every block type the real models
use; it indexes like the [V, D] fp32 tensor (an int, a list, 1-D and 2-D id tensors); small lookups come
from a bounded least-recently-used cache of decoded rows, bit for bit the decode; models, a tied LM head packed
at load and an EAGLE head give the same outputs on it as on the dense matrix.
"""

from __future__ import annotations

import copy
import math
from concurrent.futures import ThreadPoolExecutor

import gguf
import numpy as np
import pytest
import torch
from bits import bits_equal, random_k_blocks
from tiny import tiny_args, tiny_tensors

from speczoo.cache import KVCache
from speczoo.models import loader
from speczoo.models import embedding as E
from speczoo.models.embedding import EncodedEmbedding
from speczoo.zoo import weights as W

T = gguf.GGMLQuantizationType
NAME = "token_embd.weight"
V, D = 100, 256


def _source(qtype, rows: int = V, cols: int = D, seed: int = 0, narrow: bool = False) -> W.SourceTensor:
    """A random embedding as a GGUF file holds it: blocks of `qtype`, or fp32 (`narrow`: bf16 values)."""
    rng = np.random.default_rng(seed)
    if qtype in (T.Q4_K, T.Q6_K):
        return W.SourceTensor(NAME, qtype.name, torch.from_numpy(random_k_blocks(rng, rows, cols, qtype)))
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == T.F32:
        t = torch.from_numpy(a)
        return W.SourceTensor(NAME, "F32", t.to(torch.bfloat16).float() if narrow else t)
    raw = np.ascontiguousarray(gguf.quants.quantize(a, qtype)).view(np.uint8)
    return W.SourceTensor(NAME, qtype.name, torch.from_numpy(raw))


def _unpacked(tmp_path, st: W.SourceTensor):
    """(encoded, dense): the embedding written to unpacked.safetensors as a pull does, read back kept encoded
    and fully decoded."""
    path = tmp_path / "unpacked.safetensors"
    w = W.UnpackedWriter(path)
    w.add(st)
    w.close()
    return loader.read_unpacked(path, encoded=[NAME])[NAME], loader.read_unpacked(path)[NAME]


@pytest.fixture
def small_chunks(monkeypatch):
    """Dequantize in chunks of 16 rows: the full decode runs the chunked, threaded path, and so do big lookups."""
    monkeypatch.setattr(loader, "_DEQUANT_ROWS", 16)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.F16, T.BF16])
def test_rows_are_the_full_decode_bit_for_bit(tmp_path, small_chunks, qtype):
    emb, dense = _unpacked(tmp_path, _source(qtype))
    assert isinstance(emb, EncodedEmbedding) and emb.stored.dtype == torch.uint8
    assert emb.shape == dense.shape == (V, D) and emb.dtype == torch.float32
    assert bits_equal(emb.to_dense(), dense)
    few = torch.tensor([7, 0, V - 1, 7, 42])                  # one chunk (duplicates too)
    many = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(1))   # several chunks
    for ids in (few, many, torch.arange(V)):
        assert bits_equal(emb[ids], dense[ids])


def test_an_f32_embedding_stays_dense_and_a_narrow_one_is_widened_per_row(tmp_path):
    emb, dense = _unpacked(tmp_path, _source(T.F32))
    assert isinstance(emb, torch.Tensor) and bits_equal(emb, dense)        # fp32 in the file: nothing to save
    emb, dense = _unpacked(tmp_path, _source(T.F32, narrow=True))
    assert isinstance(emb, EncodedEmbedding) and emb.stored.dtype == torch.bfloat16
    ids = torch.tensor([[3, 1], [99, 3]])
    assert bits_equal(emb[ids], dense[ids]) and bits_equal(emb.to_dense(), dense)


def test_indexes_like_the_dense_tensor(tmp_path):
    emb, dense = _unpacked(tmp_path, _source(T.Q8_0))
    assert emb.size() == dense.size() and emb.size(1) == D and len(emb) == V
    cases = [5, -1, torch.tensor(5), [1, 2, 2], torch.tensor([4, 9]), torch.tensor([[1, 2, 3], [4, 5, 6]]),
             np.array([3, 8]), torch.tensor([9], dtype=torch.int32), torch.zeros(0, dtype=torch.long),
             torch.zeros(2, 0, dtype=torch.long)]
    for ids in cases:
        want = dense[torch.as_tensor(ids).long()]
        got = emb[ids]
        assert got.shape == want.shape and bits_equal(got, want), ids
    with pytest.raises(IndexError):
        emb[torch.tensor([V])]
    for bad in (slice(0, 2), torch.tensor([1.0]), torch.tensor([True]), "3"):
        with pytest.raises(TypeError, match="to_dense"):
            emb[bad]
    with pytest.raises(ValueError, match="on the CPU"):
        emb[torch.tensor([1], device="meta")]


def test_a_bad_decoder_or_stored_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="fp32"):
        EncodedEmbedding(torch.zeros(4, 8, dtype=torch.float16), lambda rows: rows)
    with pytest.raises(ValueError, match="V >= 1"):
        EncodedEmbedding(torch.zeros(8, dtype=torch.uint8), loader.row_decoder("Q8_0"))


def _counted_q8(rows: int) -> tuple[EncodedEmbedding, torch.Tensor, list[int]]:
    """A Q8_0 embedding whose cache holds `rows` rows, its full decode, and the number of rows each call of
    its decoder decoded."""
    raw = _source(T.Q8_0).data
    decode, calls = loader.row_decoder("Q8_0"), []

    def counted(stored):
        calls.append(stored.shape[0])
        return decode(stored)
    emb = EncodedEmbedding(raw, counted, cache_bytes=rows * D * 4)
    calls.clear()
    return emb, loader.dequantize(raw, "Q8_0"), calls


def test_small_lookups_are_kept_decoded_least_recently_used_first_out():
    emb, dense, calls = _counted_q8(rows=4)
    assert emb.cache_rows == 4
    assert bits_equal(emb[torch.tensor([3, 1, 3])], dense[[3, 1, 3]]) and calls == [2]    # each row decoded once
    assert bits_equal(emb[[1]], dense[[1]]) and bits_equal(emb[3], dense[3]) and calls == [2]   # both kept
    assert bits_equal(emb[[5, 7]], dense[[5, 7]]) and calls == [2, 2]
    assert bits_equal(emb[[9]], dense[[9]]) and calls == [2, 2, 1]       # a fifth row: 1, used least lately, goes
    assert bits_equal(emb[[3, 5, 7, 9]], dense[[3, 5, 7, 9]]) and calls == [2, 2, 1]
    assert bits_equal(emb[[1]], dense[[1]]) and calls == [2, 2, 1, 1]
    assert len(emb._rows) == 4
    assert bits_equal(emb[-1], dense[V - 1]) and bits_equal(emb[[V - 1]], dense[[V - 1]]) and calls[-1:] == [1]


def test_a_looked_up_row_is_a_copy_and_big_lookups_bypass_the_cache():
    emb, dense, calls = _counted_q8(rows=8)
    got = emb[[4]]
    got.add_(1.0)                                                   # the caller's tensor, not the kept row
    assert bits_equal(emb[[4]], dense[[4]]) and calls == [1]
    many = torch.arange(E.CACHE_LOOKUP + 1) % V
    assert bits_equal(emb[many], dense[many]) and calls == [1, E.CACHE_LOOKUP + 1] and len(emb._rows) == 1
    assert bits_equal(emb[torch.arange(9)], dense[:9]) and calls[-1] == 9 and len(emb._rows) == 1   # more than it holds
    none = EncodedEmbedding(_source(T.Q8_0).data, loader.row_decoder("Q8_0"), cache_bytes=0)
    assert none.cache_rows == 0 and bits_equal(none[[2, 2]], dense[[2, 2]]) and not none._rows
    with pytest.raises(ValueError, match="cache_bytes"):
        EncodedEmbedding(_source(T.Q8_0).data, loader.row_decoder("Q8_0"), cache_bytes=-1)


def test_threads_and_copies_share_no_cache_state(tmp_path):
    emb, dense = _unpacked(tmp_path, _source(T.Q5_0))
    ids = torch.randint(0, V, (400, 3), generator=torch.Generator().manual_seed(2))
    with ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(lambda i: emb[ids[i]], range(len(ids))))
    assert all(bits_equal(r, dense[ids[i]]) for i, r in enumerate(rows))
    twin = copy.deepcopy(emb)
    assert not twin._rows and twin._lock is not emb._lock and bits_equal(twin[[5, 6]], dense[[5, 6]])


def _q8_embedding(tensors: dict[str, torch.Tensor]) -> tuple[EncodedEmbedding, torch.Tensor]:
    """The model's embedding as Q8_0 blocks kept encoded, and its full decode."""
    raw = np.ascontiguousarray(gguf.quants.quantize(tensors[NAME].numpy(), T.Q8_0)).view(np.uint8)
    return (EncodedEmbedding(torch.from_numpy(raw), loader.row_decoder("Q8_0")),
            loader.dequantize(raw, "Q8_0"))


def _logits(model, n: int = 9) -> torch.Tensor:
    tokens = torch.arange(3, 3 + n) % model.args.vocab_size
    return model(tokens, torch.arange(n), KVCache(model.args, max_seq=32)).logits


@pytest.mark.parametrize("arch,tied,backend", [("qwen2", False, "q8_torch"), ("gemma3", True, "q8_torch"),
                                               ("qwen2", True, "fp32"), ("gemma3", True, "fp32")])
def test_a_model_on_the_encoded_embedding_gives_the_same_logits(arch, tied, backend):
    """Looked up by the model, and (fp32, tied) read whole when its LM head is packed at load."""
    args = tiny_args(arch, dim=64, embed_scale=math.sqrt(64), tie_embeddings=tied)
    tensors = tiny_tensors(args, tied=tied)
    emb, dense = _q8_embedding(tensors)
    model = loader.build_model(args, {**tensors, NAME: emb}, backend)
    assert model.embed is emb
    assert torch.equal(_logits(model), _logits(loader.build_model(args, {**tensors, NAME: dense}, backend)))


def test_an_eagle_head_drafts_the_same_on_the_encoded_embedding():
    from speczoo.decoding.eagle.config import HeadConfig
    from speczoo.decoding.eagle.head import EagleHead
    args = tiny_args("qwen2", dim=64)
    emb, dense = _q8_embedding(tiny_tensors(args))
    cfg = HeadConfig(target="tiny", hidden_size=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96,
                     target_vocab=args.vocab_size, draft_vocab=32, aux_layer_ids=(1, 2, 3), rope_theta=10_000.0)
    heads = [EagleHead(cfg, e, seed=3) for e in (emb, dense)]
    assert heads[0].embed is emb and "embed" not in dict(heads[0].named_buffers())
    tokens, hidden = torch.tensor([5, 9, 5]), torch.randn(3, 64)
    outs = [h.step(tokens, hidden, torch.arange(3), KVCache(h.kv_args(), max_seq=8)) for h in heads]
    assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].hidden, outs[1].hidden)

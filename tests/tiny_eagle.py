"""A tiny random target and an EAGLE-3 head trained on its features in seconds, for the tests of the EAGLE
drafter, the replays and the rounds (the `trained` fixture of conftest.py builds one per test module).
Imported by test files and conftest.py, never a test itself."""

from __future__ import annotations

import torch

from speczoo.decoding.eagle.io import load_head
from speczoo.training.eagle.pipeline import EagleTrainOptions, Target, train_eagle
from speczoo.training.eagle.train import TrainConfig
from tiny import tiny_model, tiny_tensors

VOCAB = 128
INVARIANT = "fp32-rows"
PROMPT = [5, 17, 33, 2, 90, 61, 7, 7, 12, 40]


def train_tiny_head(tmp_path_factory):
    """(model, args, head): the tiny qwen2 target and a head trained on its features for 80 steps."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("eagle")
    corpus = tmp / "corpus"
    corpus.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(4):
        (corpus / f"f{i}.txt").write_text(" ".join(str(int(x)) for x in torch.randint(0, 60, (500,), generator=g)))
    model, args = tiny_model("qwen2", backend=INVARIANT, seed=3)
    target = Target(name="tiny", model=model, tensors=tiny_tensors(args, seed=3),
                    encode=lambda text: [b % (VOCAB - 1) for b in text.encode()], separator=VOCAB - 1)
    opts = EagleTrainOptions(out=tmp / "run", corpus=[corpus], max_tokens=64 * 48, seq_len=64, shard_seqs=8,
                             draft_vocab=VOCAB, train=TrainConfig(steps=80, batch=8, lr=3e-3, warmup=5,
                                                                 checkpoint_every=80, progress=False))
    rep = train_eagle(target, opts)
    return model, args, load_head(rep.head_dir, model.embed)

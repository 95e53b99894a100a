"""`train-eagle` end to end: features -> draft vocabulary -> head -> training -> speculators head.

Work directory layout (--out DIR):
  DIR/features/     the feature cache (training/eagle/features.py), reused by later runs on the same data
  DIR/answers.jsonl the target's answers to --prompts (training/eagle/answers.py), read back on --resume
  DIR/checkpoint/   the latest checkpoint (training/eagle/train.py); --resume continues from it
  DIR/head/         the final head in the speculators format, calibrated on the held-out chunks
                    (training/eagle/holdout.py)
and, when a name is given, a copy installed as a zoo entry ($SPECZOO_HOME/eagle/NAME).
A run without --resume refuses a directory that already holds a checkpoint rather than overwrite it.
This module wires the stages together; each stage lives in its own module.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from speczoo.decoding.eagle.config import head_config_for
from speczoo.training.eagle.answers import AnswerLog, answer_chunks, conversations, prompts_digest
from speczoo.training.eagle.features import (ExtractStats, FeatureManifest, FeatureSet, corpus_chunks, corpus_digest,
                                         corpus_files, default_corpus, extract)
from speczoo.decoding.eagle.head import EagleHead
from speczoo.training.eagle.holdout import HeldOut, calibrate, judge, split
from speczoo.decoding.eagle.io import save_head
from speczoo.training.eagle.train import CHECKPOINT, TrainConfig, TrainResult, load_checkpoint, train
from speczoo.training.eagle.vocab import draft_vocab
from speczoo.zoo.heads import HeadEntry, check_name, install_head


@dataclass
class EagleTrainOptions:
    out: Path
    corpus: list[Path] | None = None       # None: the standard library on this machine, unless prompts are given
    prompts: list[str] | None = None       # answered by the target first (Target.answer): chat-style data
    answer_tokens: int = 256               # greedy tokens per answer
    answer_batch: int = 8                  # prompts answered side by side (one packed decode)
    follow_ups: int = 0                    # further user turns per prompt (answers.FOLLOW_UPS)
    max_tokens: int = 200_000              # tokens of features to extract and train on
    seq_len: int = 512                     # chunk length L
    shard_seqs: int = 8                    # chunks per feature shard
    draft_vocab: int = 32_000
    ffn_dim: int | None = None             # the head's MLP width (None: the target's)
    name: str | None = None                # install the result as this zoo entry
    resume: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class EagleTrainReport:
    features: ExtractStats
    result: TrainResult
    held_out: HeldOut | None               # the head on chunks it never trained on (None: none held out)
    head_dir: Path
    installed: HeadEntry | None


@dataclass
class Target:
    """What training needs of the target: its forward, weights (for the LM-head start) and tokenizer."""
    name: str
    model: object                          # speczoo forward contract; .args, .embed [V, D]
    tensors: Mapping[str, Tensor]          # bundle tensors (GGUF names)
    encode: Callable[[str], list[int]]
    separator: int | None                  # id between corpus files (an end-of-text id)
    eos_ids: tuple[int, ...] = ()
    # (conversations' user turns, max new tokens per reply) -> each conversation's ids (its turns through
    # the chat template, each followed by the target's greedy reply)
    answer: Callable[[list[list[str]], int], list[list[int]]] | None = None


def train_eagle(target: Target, opts: EagleTrainOptions) -> EagleTrainReport:
    if opts.name is not None:
        check_name(opts.name)
    out = Path(opts.out)
    if (out / CHECKPOINT).exists() and not opts.resume:
        raise ValueError(f"{out} already holds a training run ({out / CHECKPOINT}); pass --resume to continue "
                         "it or choose another --out")
    args = target.model.args
    cfg = head_config_for(target.name, args, opts.draft_vocab, opts.ffn_dim, opts.train.ttt_steps)
    chunks, digest = training_chunks(target, opts)
    want = FeatureManifest(target=target.name, layers=list(cfg.target_layers), hidden=args.dim,
                           vocab=args.vocab_size, seq_len=opts.seq_len, corpus=digest,
                           seed=opts.train.seed, shard_seqs=opts.shard_seqs)
    stats = extract(target.model, chunks, want, out / "features", opts.max_tokens, opts.train.progress)
    data = FeatureSet(out / "features")
    device = opts.train.device
    if opts.resume:
        head, opt, state = load_checkpoint(out, target.model.embed.to_dense(), opts.train)
        if head.cfg.target_layers != cfg.target_layers:
            raise ValueError(f"the checkpoint's head reads layers {head.cfg.target_layers}, the features "
                             f"{cfg.target_layers}")
    else:
        head = new_head(target, cfg, data, opts.train.seed)
        head.to(device)
        opt, state = None, None
    # a cache filled further by an earlier run on the same data serves its first max_tokens only
    chunks, held = split(min(len(data), opts.max_tokens // opts.seq_len), opts.train.holdout_every)
    result = train(head, data, opts.train, out, opt, state, chunks)
    held_out = judge(head, data, held, opts.train.ttt_steps, opts.train.batch, device)
    if held_out is not None:                   # the checkpoint keeps the uncalibrated head, for --resume
        calibrate(head, held_out.temperature)
    head_dir = save_head(head.cpu(), out / "head", held_out.metadata() if held_out else None)
    installed = install_head(head_dir, opts.name) if opts.name else None
    return EagleTrainReport(features=stats, result=result, held_out=held_out, head_dir=head_dir,
                            installed=installed)


def training_chunks(target: Target, opts: EagleTrainOptions) -> tuple[Iterator[list[int]], str]:
    """The chunk stream features are extracted from, and its digest: the target's answers to the prompts
    first (when given), then the corpus files (the standard library when neither is given)."""
    streams: list[Iterator[list[int]]] = []
    sources: list[str] = []
    if opts.prompts:
        if target.answer is None:
            raise ValueError("training on prompts needs the target's answers (Target.answer)")
        if opts.answer_tokens < 1:
            raise ValueError(f"answers need at least 1 token, got answer_tokens={opts.answer_tokens}")
        answer, n = target.answer, opts.answer_tokens
        convs = conversations(opts.prompts, opts.follow_ups)
        log = AnswerLog(Path(opts.out) / "answers.jsonl", lambda cs: answer(cs, n), n)
        streams.append(answer_chunks(log, convs, opts.seq_len, target.separator, opts.answer_batch))
        sources.append(f"prompts:{prompts_digest(opts.prompts)}x{n}"
                       + (f"+{opts.follow_ups}turns" if opts.follow_ups else ""))
    if opts.corpus or not opts.prompts:
        files = corpus_files(opts.corpus or default_corpus())
        streams.append(corpus_chunks(target.encode, files, opts.seq_len, opts.train.seed, target.separator))
        sources.append(corpus_digest(files))
    return itertools.chain(*streams), "+".join(sources)


def new_head(target: Target, cfg, data: FeatureSet, seed: int = 0) -> EagleHead:
    """A fresh head: draft vocabulary = the ids the target predicts most often on the data (its end
    ids always in), LM head and final norm started from the target's."""
    head = EagleHead(cfg, target.model.embed.to_dense(), seed=seed)      # trained on any device: a buffer
    head.set_vocab(draft_vocab(data.top1_counts(), cfg.draft_vocab, always=target.eos_ids))
    t = target.tensors
    lm = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    head.init_from_target(lm, t["output_norm.weight"])
    return head

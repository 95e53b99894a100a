"""The head's training loop: AdamW over the training-time test, checkpoints, exact resume.

Each step draws `batch` chunks from the feature cache with a generator seeded by (seed, step), so a
run resumed from a checkpoint sees the same batches as one that never stopped. A checkpoint is one
directory, replaced atomically: head/ (the speculators format), optimizer.safetensors (AdamW's
moments, never pickled) and state.json (step, loss history). This module never runs the target.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from speczoo.training.eagle.features import FeatureSet
from speczoo.decoding.eagle.head import EagleHead
from speczoo.training.eagle.holdout import HOLDOUT_EVERY
from speczoo.decoding.eagle.io import load_head, save_head
from speczoo.training.eagle.ttt import unroll
from speczoo.training.eagle.vocab import t2d_index
from speczoo.paths import replace_dir

CHECKPOINT = "checkpoint"


@dataclass
class TrainConfig:
    steps: int = 1000            # total optimizer steps (a resumed run continues up to this)
    batch: int = 4               # chunks per step
    lr: float = 5e-4
    warmup: int = 30
    ttt_steps: int = 3           # training-time-test depth
    decay: float = 0.8           # weight of step j's loss: decay ** j
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "bf16"          # matmul precision (autocast; weights and AdamW stay fp32): bf16 or fp32
    checkpoint_every: int = 100
    holdout_every: int = HOLDOUT_EVERY   # one chunk in this many is held out of training (training/eagle/holdout.py)
    progress: bool = True

    def __post_init__(self):
        if self.dtype not in ("bf16", "fp32"):
            raise ValueError(f"training dtype must be bf16 or fp32, got {self.dtype!r}")
        if self.steps < 0 or self.batch < 1 or self.ttt_steps < 1 or self.holdout_every < 0:
            raise ValueError(f"need steps >= 0, batch >= 1, ttt_steps >= 1 and holdout_every >= 0; got {self.steps}, "
                             f"{self.batch}, {self.ttt_steps}, {self.holdout_every}")

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine down to a tenth."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)      # per step
    acc: list[list[float]] = field(default_factory=list)   # per step, per TTT step

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def read(cls, path: Path) -> TrainState:
        return cls(**json.loads(path.read_text()))


@dataclass
class TrainResult:
    state: TrainState
    steps_run: int               # by this call
    seconds: float               # this call's wall time
    tokens_per_step: int

    @property
    def steps_per_s(self) -> float:
        return self.steps_run / self.seconds if self.seconds > 0 else 0.0

    def recent_acc(self, n: int = 20) -> list[float]:
        """Mean top-1 agreement per TTT step over the last n steps."""
        rows = self.state.acc[-n:]
        return [sum(r[j] for r in rows) / len(rows) for j in range(len(rows[0]))] if rows else []


def make_optimizer(head: EagleHead, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr,
                             betas=(0.9, 0.95), weight_decay=0.0)


def save_checkpoint(work: Path, head: EagleHead, opt: torch.optim.Optimizer, state: TrainState) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CHECKPOINT}.", dir=work))
    try:
        save_head(head, tmp / "head")
        sd = opt.state_dict()
        tensors = {f"{i}.{k}": v.detach().cpu().contiguous().reshape(v.shape)
                   for i, s in sd["state"].items() for k, v in s.items()}
        save_file(tensors, str(tmp / "optimizer.safetensors"),
                  metadata={"param_groups": json.dumps(sd["param_groups"])})
        state.write(tmp / "state.json")
        replace_dir(tmp, work / CHECKPOINT)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return work / CHECKPOINT


def load_checkpoint(work: Path, embed: torch.Tensor, cfg: TrainConfig) -> tuple[EagleHead, torch.optim.AdamW,
                                                                                  TrainState]:
    d = work / CHECKPOINT
    if not (d / "state.json").is_file():
        raise FileNotFoundError(f"no checkpoint in {work} to resume from (expected {d}/state.json); "
                                "run without --resume to start training")
    head = load_head(d / "head", embed).to(cfg.device)
    head.train()
    opt = make_optimizer(head, cfg)
    from safetensors import safe_open
    with safe_open(str(d / "optimizer.safetensors"), framework="pt") as f:
        groups = json.loads(f.metadata()["param_groups"])
    flat = load_file(str(d / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in flat.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = v.to(cfg.device) if name != "step" else v
    opt.load_state_dict({"state": state, "param_groups": groups})
    return head, opt, TrainState.read(d / "state.json")


def train(head: EagleHead, data: FeatureSet, cfg: TrainConfig, work: Path,
          opt: torch.optim.AdamW | None = None, state: TrainState | None = None,
          chunks: list[int] | None = None) -> TrainResult:
    """Train `head` (already on cfg.device) up to cfg.steps on the cache's `chunks` (default: all of
    them); checkpoint into work/ every cfg.checkpoint_every steps and at the end. Pass the optimizer and
    state of a loaded checkpoint to resume."""
    work = Path(work)
    head.train()
    opt = opt or make_optimizer(head, cfg)
    state = state or TrainState()
    index = t2d_index(head.draft_to_target.cpu(), head.cfg.target_vocab)        # [V] draft id or -100
    seq = data.manifest.seq_len
    chunks = list(range(len(data))) if chunks is None else chunks
    if not chunks:
        raise ValueError("no chunks to train on: the feature cache is empty or all of it is held out")
    start, t0 = state.step, time.perf_counter()
    last = t0
    bar = tqdm(total=cfg.steps, initial=state.step, unit="step", desc="train", disable=not cfg.progress,
               dynamic_ncols=True)
    while state.step < cfg.steps:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.step)
        pick = [chunks[i] for i in torch.randint(0, len(chunks), (cfg.batch,), generator=g).tolist()]
        feats, ids, top1 = data.get(pick)
        labels = index[top1]                                                     # [B, L]
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(state.step)
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.dtype == "bf16"):
            out = unroll(head, feats.to(cfg.device), ids.to(cfg.device), labels.to(cfg.device), cfg.ttt_steps,
                         cfg.decay)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        state.step += 1
        state.losses.append(float(out.loss.detach()))
        state.acc.append(out.acc)
        bar.update(1)
        bar.set_postfix(loss=f"{state.losses[-1]:.3f}", acc="/".join(f"{a:.2f}" for a in out.acc))
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            now = time.perf_counter()
            state.seconds += now - last
            last = now
            save_checkpoint(work, head, opt, state)
    bar.close()
    seconds = time.perf_counter() - t0
    return TrainResult(state=state, steps_run=state.step - start, seconds=seconds,
                       tokens_per_step=cfg.batch * (seq - 1))

"""Speed of the EAGLE pipeline's parts for a target: feature extraction, head training, head draft step.

    python -m benchmarks.eagle_speed qwen2.5-coder-1.5b [--ffn-dim N] [--draft-vocab N] [--device cuda]

Prints target features tok/s (one forward over --seq-len tokens returning the head's three layers;
skipped with --no-features or on cuda), head training tok/s (the training-time test + AdamW on random
features, bf16 autocast and fp32) and the head's draft step per linear backend. A head of the target's
shape is built with random weights: speed does not depend on them. Times only; it trains nothing
useful and writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch


def train_tok_s(head, batch: int, seq: int, dtype: str, device: str, steps: int = 3, warmup: int = 1) -> float:
    from speczoo.training.eagle.ttt import unroll

    vd, d = head.cfg.draft_vocab, head.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(batch, seq, 3 * d, generator=g).to(device)
    ids = torch.randint(0, vd, (batch, seq), generator=g).to(device)
    labels = torch.randint(0, vd, (batch, seq), generator=g).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-5)
    for i in range(warmup + steps):
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out = unroll(head, feats, ids, labels, 3)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * batch * (seq - 1) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    from speczoo.cache import KVCache
    from speczoo.runtime import load
    from speczoo.decoding.eagle.config import head_config_for
    from speczoo.decoding.eagle.head import EagleHead
    from speczoo.eagle_drafters import head_step_ms

    p = argparse.ArgumentParser(prog="python -m benchmarks.eagle_speed", description=__doc__.split("\n")[0])
    p.add_argument("target")
    p.add_argument("--ffn-dim", type=int, default=None)
    p.add_argument("--draft-vocab", type=int, default=32_000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-features", action="store_true")
    args = p.parse_args(argv)
    t = load(args.target)
    cfg = head_config_for(args.target, t.args, args.draft_vocab, args.ffn_dim)
    print(f"{args.target} ({t.backend}); head D={cfg.hidden_size} MLP {cfg.ffn_dim} draft vocab {cfg.draft_vocab}")
    if not args.no_features and args.device == "cpu":
        cache = KVCache(t.args, args.seq_len, extra=0)
        tokens = torch.randint(0, 1000, (args.seq_len,))
        rates = []
        for _ in range(2):
            cache.reset()
            t0 = time.perf_counter()
            with torch.no_grad():
                t.model(tokens, torch.arange(args.seq_len), cache, hidden_layers=cfg.target_layers)
            rates.append(args.seq_len / (time.perf_counter() - t0))
        print(f"features: {max(rates):.0f} tok/s (best of 2 forwards of {args.seq_len} tokens)")
    head = EagleHead(cfg, t.model.embed.to_dense()).to(args.device)
    head.set_vocab(torch.arange(cfg.draft_vocab))
    for dtype in ("bf16", "fp32"):
        rate = train_tok_s(head, args.batch, args.seq_len, dtype, args.device)
        print(f"training ({dtype}, B={args.batch}, L={args.seq_len}, 3 TTT steps): {rate:.0f} tok/s")
    if args.device == "cpu":
        state = head.state_dict()
        for backend in ("fp32", "q8", "q4"):
            h = EagleHead(cfg, t.model.embed)
            h.load_state_dict(state)
            print(f"draft step ({backend}): {head_step_ms(h.pack(backend)):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

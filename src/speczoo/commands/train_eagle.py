"""`speczoo train-eagle TARGET --out DIR`: train an EAGLE-3 head for TARGET by self-distillation."""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    from speczoo.training.eagle.holdout import HOLDOUT_EVERY

    p = sub.add_parser(
        "train-eagle", help="train an EAGLE-3 draft head for a target (self-distillation on a local corpus)",
        description="Extract the target's features over a local corpus (cached in DIR/features), train an "
                    "EAGLE-3 head on them with the training-time test (checkpoints in DIR/checkpoint), write it "
                    "in the speculators format (DIR/head) and install it as the zoo entry --name, usable as "
                    "--spec eagle:NAME.")
    p.add_argument("target", help="target model: zoo name or path (pulled)")
    p.add_argument("--corpus", nargs="+", type=Path, default=None,
                   help="files or directories of text (default: the Python standard library's source)")
    p.add_argument("--prompts", default=None,
                   help="a file of prompts (one per line, or JSONL with \"prompt\"/\"turns\"), or 'builtin' for "
                        "the shipped set of ~300 chat prompts (stories, explanations, essays, emails, code): the "
                        "target answers each through its chat template and trains on those conversations first "
                        "(with no --corpus, on them alone)")
    p.add_argument("--answer-tokens", type=int, default=256, help="greedy tokens per answer (default 256)")
    p.add_argument("--follow-ups", type=int, default=0,
                   help="further user turns per prompt (0-12 generic requests such as 'Give me a concrete "
                        "example.'), each answered by the target: multi-turn conversations, more data per prompt")
    p.add_argument("--answer-batch", type=int, default=8,
                   help="prompts the target answers side by side, one forward per token for all of them "
                        "(default 8: ~3x the tokens per second of one at a time on a CPU; same text)")
    p.add_argument("--out", required=True, type=Path, help="work directory (features, checkpoints, head)")
    p.add_argument("--name", default=None,
                   help="install the head as this zoo entry (must contain 'eagle'; default TARGET-eagle3)")
    p.add_argument("--steps", type=int, default=1000, help="total training steps (default 1000)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--device", default="cpu", help="where the head trains: cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                   help="training matmul precision (bf16 autocast, fp32 master weights; default bf16)")
    p.add_argument("--tokens", type=int, default=200_000, help="tokens of features to train on (default 200k): extracted "
                   "into DIR/features, or the first of those a cache there already holds")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training chunk (default 512)")
    p.add_argument("--batch", type=int, default=4, help="chunks per step (default 4)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--ttt-steps", type=int, default=3, help="training-time-test depth (default 3)")
    p.add_argument("--draft-vocab", type=int, default=32_000, help="draft vocabulary size (default 32000)")
    p.add_argument("--ffn-dim", type=int, default=None, help="the head's MLP width (default: the target's)")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--holdout-every", type=int, default=HOLDOUT_EVERY,
                   help=f"hold one chunk in N out of training: the head is judged on those (top-1 agreement on "
                        f"unseen text) and its confidences calibrated there (default {HOLDOUT_EVERY}; 0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default=None, help="the target's linear backend for feature extraction "
                   "(default: the one it runs with)")
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.runtime import load
    from speczoo.training.eagle.answers import FOLLOW_UPS, builtin_prompts, read_prompts
    from speczoo.training.eagle.pipeline import EagleTrainOptions, Target, train_eagle
    from speczoo.training.eagle.train import TrainConfig
    from speczoo.zoo.weights import lm_head_tensors

    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this torch build sees no CUDA device; use --device cpu")
    name = args.name or f"{Path(args.target).name}-eagle3"
    if args.answer_tokens < 1:
        raise ValueError(f"--answer-tokens must be >= 1, got {args.answer_tokens}")
    if not 0 <= args.follow_ups <= len(FOLLOW_UPS):
        raise ValueError(f"--follow-ups must be in 0..{len(FOLLOW_UPS)}, got {args.follow_ups}")
    if args.answer_batch < 1:
        raise ValueError(f"--answer-batch must be >= 1, got {args.answer_batch}")
    prompts = None
    if args.prompts:
        prompts = read_prompts(builtin_prompts() if args.prompts == "builtin" else Path(args.prompts))
    t = load(args.target, args.backend)
    tok = t.tokenizer
    target = Target(name=args.target, model=t.model, tensors=lm_head_tensors(t.path),
                    encode=tok.encode, separator=min(tok.eos_ids) if tok.eos_ids else None,
                    eos_ids=tuple(tok.eos_ids), answer=answerer(t) if prompts else None)
    opts = EagleTrainOptions(
        out=args.out, corpus=args.corpus, prompts=prompts, answer_tokens=args.answer_tokens,
        answer_batch=args.answer_batch, follow_ups=args.follow_ups,
        max_tokens=args.tokens, seq_len=args.seq_len, draft_vocab=args.draft_vocab, ffn_dim=args.ffn_dim,
        name=name, resume=args.resume,
        train=TrainConfig(steps=args.steps, batch=args.batch, lr=args.lr, ttt_steps=args.ttt_steps,
                          seed=args.seed, device=args.device, dtype=args.dtype, checkpoint_every=args.checkpoint_every,
                          holdout_every=args.holdout_every))
    rep = train_eagle(target, opts)
    f, r = rep.features, rep.result
    acc = r.recent_acc()
    print(f"features: {f.tokens} tokens cached ({f.new_tokens} new, {f.tok_s:.0f} tok/s)", file=sys.stderr)
    print(f"training: step {r.state.step}, {r.steps_run} steps this run at {r.steps_per_s:.2f} steps/s "
          f"({r.steps_per_s * r.tokens_per_step:.0f} tok/s); loss {r.state.losses[-1]:.3f}; "
          f"top-1 agreement by step (last 20 training batches) {' / '.join(f'{a:.2f}' for a in acc)}", file=sys.stderr)
    if rep.held_out is not None:
        print(f"judged: {rep.held_out.describe()}", file=sys.stderr)
    print(f"head: {rep.head_dir}" + (f", installed as {rep.installed.name} (--spec eagle:{rep.installed.name})"
                                     if rep.installed else ""))
    return 0


def answerer(target):
    """(conversations' user turns, max new tokens) -> each conversation's ids: its turns through the chat
    template, each followed by the target's greedy reply (the earlier replies enter the later turns'
    prompts as text, as in a chat). The conversations are decoded side by side, one turn at a time
    (speczoo/greedy_many.py), exactly plain greedy's. A model with sliding-window layers (no packed decode)
    answers one conversation at a time through the engine, with lossless speculation (`auto`, with the
    zoo's draft model for it when pulled)."""
    from speczoo.greedy_many import greedy_many

    tok = target.tokenizer
    if target.args.sliding_window == 0:
        def reply(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
            return greedy_many(target.model, prompts, max_tokens, tok.eos_ids)
    else:
        reply = engine_reply(target)

    def answer(convs: list[list[str]], max_tokens: int) -> list[list[int]]:
        messages: list[list[dict]] = [[] for _ in convs]
        ids: list[list[int]] = [[] for _ in convs]
        for turn in range(max(len(c) for c in convs)):
            live = [i for i, c in enumerate(convs) if turn < len(c)]
            for i in live:
                messages[i].append({"role": "user", "content": convs[i][turn]})
            prompts = [tok.chat_ids(messages[i]) for i in live]
            for i, p, r in zip(live, prompts, reply(prompts, max_tokens)):
                messages[i].append({"role": "assistant", "content": tok.decode(r)})
                ids[i] = p + r
        return ids
    return answer


def engine_reply(target):
    """answerer's way for a model without packed decode: one prompt at a time through the engine."""
    from speczoo.bench.ab import run_request
    from speczoo.errors import NotPulledError
    from speczoo.request import GenerationRequest
    from speczoo.runtime import Runtime, load
    from speczoo.zoo.registry import default_draft

    draft = default_draft(target.name)
    try:
        d = load(draft) if draft else None
    except NotPulledError as e:
        print(f"answers without the draft model ({e}); prompt lookup only", file=sys.stderr)
        d = None
    rt = Runtime(target, draft=d)

    def reply(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        return [run_request(rt, GenerationRequest(prompt_ids=p, max_new_tokens=max_tokens, spec="auto")).ids
                for p in prompts]
    return reply

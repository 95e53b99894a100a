"""`speczoo bench TARGET --spec MODE`: the A/B of plain greedy vs speculative on one prompt."""

from __future__ import annotations

from speczoo.bench.ab import read_prompt_ids, run_ab
from speczoo.bench.prompts import BUILTIN_PROMPTS, builtin_prompt
from speczoo.commands._model_args import add_model_args, draft_for, eagle_for
from speczoo.request import SamplingParams


def register(sub) -> None:
    p = sub.add_parser("bench", help="A/B: plain greedy vs speculative on one prompt (lossless check + speed)")
    p.add_argument("target", help="target model: zoo name or path")
    p.add_argument("--spec", default="ngram", help="ngram | ngram-tree | draft | draft:NAME | "
                   "eagle[:NAME] | eagle-tree[:NAME] | auto (default ngram); the tree modes draft a token tree "
                   "of up to --k nodes")
    p.add_argument("--k", type=int, default=8, help="max draft tokens per round")
    p.add_argument("--ngram", type=int, default=3, help="max n-gram order of prompt lookup")
    p.add_argument("--gen", type=int, default=96, help="new tokens per run")
    p.add_argument("--runs", type=int, default=3, help="runs of each side; medians are reported")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (one user message through the chat template)")
    src.add_argument("--prompt-file", help="file whose text is the prompt")
    src.add_argument("--prompt-ids", help="file of token ids (from `speczoo tokenize`), used as is")
    src.add_argument("--builtin", choices=[b.name for b in BUILTIN_PROMPTS], help="a built-in prompt")
    p.add_argument("--raw", action="store_true", help="do not wrap text prompts in the chat template")
    add_model_args(p)
    p.set_defaults(func=run)


def prompt_ids_from_args(args, runtime) -> list[int]:
    if args.prompt_ids:
        return read_prompt_ids(args.prompt_ids, runtime.vocab_size, runtime.name)
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            text = f.read()
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = builtin_prompt(args.builtin or "code_edit").message
    if args.raw:
        return runtime.tokenizer.encode(text)
    return runtime.chat_ids([{"role": "user", "content": text}])


def run(args) -> int:
    from speczoo.runtime import load_runtime
    rt = load_runtime(args.target, draft=draft_for(args.target, args.spec, args.draft),
                      backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type, remeasure_costs=True,
                      eagle_head=eagle_for(args.spec), draft_vocab=args.draft_vocab)
    ids = prompt_ids_from_args(args, rt)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    res = run_ab(rt, ids, args.spec, k=args.k, ngram=args.ngram, gen=args.gen, runs=args.runs,
                 sampling=sampling)
    print(f"prompt: {len(ids)} tokens; backend {rt.target.backend}; {args.runs} run(s) of each side")
    for line in res.lines():
        print(line)
    return 0 if res.lossless or not sampling.greedy else 1

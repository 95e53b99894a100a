"""`speczoo check-pair DRAFT TARGET`: may DRAFT draft for TARGET? (vocab, tokens, first-token gate)"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("check-pair", help="check that a draft model can draft for a target")
    p.add_argument("draft", help="zoo name or path of a GGUF file or Hugging Face directory")
    p.add_argument("target", help="zoo name or path of a GGUF file or Hugging Face directory")
    p.add_argument("--backend", default=None)
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.runtime import load
    from speczoo.decoding.pair import check_pair

    report = check_pair(load(args.draft, args.backend), load(args.target, args.backend))
    if report.ok:
        print(f"PAIR OK: {args.draft} can draft for {args.target} "
              f"(first token on the probe prompt: {report.target_first!r} from both)")
        if report.padding:
            print(f"  {report.padding}: the draft proposes only ids the target has")
        return 0
    print(f"PAIR REFUSED: {args.draft} cannot draft for {args.target}")
    for p in report.problems:
        print(f"  - {p}")
    print(report.advice(args.target))
    return 1

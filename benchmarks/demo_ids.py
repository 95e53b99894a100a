"""The token ids of every built-in demo prompt, plain greedy and speculative, written to a JSON file: run it
from two checkouts and compare the files to show that a change moved no token.

    python -m benchmarks.demo_ids before.json          # from the old checkout (PYTHONPATH=its src)
    python -m benchmarks.demo_ids after.json --compare before.json

Never times anything: ids only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def demo_ids(model: str, gen: int, specs: list[str]) -> dict[str, list[int]]:
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    rt = load_runtime(model)
    out: dict[str, list[int]] = {}
    for p in BUILTIN_PROMPTS:
        ids = rt.chat_ids([{"role": "user", "content": p.message}])
        for spec in specs:
            *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec=spec))
            out[f"{p.name}:{spec}"] = done.ids
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="JSON file to write: {prompt:spec -> ids}")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--specs", default="off,auto")
    ap.add_argument("--compare", type=Path, help="a file an earlier run wrote: count the runs with equal ids")
    args = ap.parse_args(argv)
    out = demo_ids(args.model, args.gen, args.specs.split(","))
    args.out.write_text(json.dumps(out))
    same_as_greedy = all(v == out[k.rsplit(":", 1)[0] + ":off"] for k, v in out.items() if f"{k.rsplit(':', 1)[0]}:off" in out)
    print(f"{len(out)} runs, {sum(map(len, out.values()))} tokens; every mode equals greedy: {same_as_greedy}")
    if args.compare is not None:
        old = json.loads(args.compare.read_text())
        same = sum(old.get(k) == v for k, v in out.items())
        print(f"identical to {args.compare}: {same}/{len(out)}")
        return 0 if same == len(out) == len(old) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`speczoo cv MODEL`: the measured verify-cost curve c_v(S) = time(S) / time(1)."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("cv", help="measure c_v(S): forward cost over S tokens relative to one decode step")
    p.add_argument("model", help="zoo name or path")
    p.add_argument("--max-s", type=int, default=17, help="largest S (default 17)")
    p.add_argument("--sizes", default=None, help="comma-separated S values (default 1,2,3,5,9,max-s)")
    p.add_argument("--context", type=int, default=64, help="tokens already in the cache")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--backend", default=None, help="linear backend (default: the fast one)")
    p.add_argument("--one-row-prefetch", choices=("timed", "on", "off"), default="timed",
                   help="the kernels' software prefetch in a one-row forward: timed both ways first and the "
                        "faster kept, as a cost profile does (default), or forced on or off")
    p.add_argument("--save", action="store_true",
                   help="store the result as the model's cost profile (what the controller uses)")
    p.add_argument("--json", action="store_true", help='print {"cv": {"1": 1.0, ...}, ...} for scripts')
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.decoding.pricing.cost import ceiling
    from speczoo.decoding.pricing.profile import measure_cv, one_row_choice
    from speczoo.runtime import load

    if args.max_s < 1:
        raise ValueError(f"--max-s must be >= 1, got {args.max_s}")
    sizes = ([int(x) for x in args.sizes.split(",")] if args.sizes
             else sorted({1, 2, 3, 5, 9, args.max_s} & set(range(1, args.max_s + 1))))
    if args.save and args.one_row_prefetch != "timed":
        raise ValueError("--save stores the profile a load would time: leave --one-row-prefetch at 'timed'")
    m = load(args.model, args.backend)
    one_row = None
    if args.one_row_prefetch == "timed":
        one_row = one_row_choice(m)
    else:
        m.model.one_row_prefetch = args.one_row_prefetch == "on"
    res = measure_cv(m.model, m.args, sizes, context=args.context, repeats=args.repeats)
    data = res.to_json(args.model, m.backend)
    if one_row is not None:
        data["one_row"] = one_row.to_json()
    if args.save:
        from speczoo.decoding.drafters.draft_model import reduced_head
        from speczoo.decoding.pricing.profile import profile_data, write_profile
        data = profile_data(m, res, args.repeats, draft_head=reduced_head, one_row=one_row)
        write_profile(m, data)
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"{args.model} backend {m.backend}, context {args.context}, median of {args.repeats}")
    if one_row is not None:
        print(one_row.describe())
    else:
        print(f"one-row software prefetch {'on' if m.model.one_row_prefetch else 'off'}"
              + (" (forced)" if args.one_row_prefetch != "timed" else " (nothing to time: no compiled kernels)"))
    print(f"{'S':>4} {'ms':>9} {'c_v':>6}")
    for s, ms in res.ms.items():
        print(f"{s:>4} {ms:>9.2f} {res.cv[s]:>6.2f}")
    if any(s >= 2 for s in res.cv):
        top = ceiling(res.cv)
        print(f"ceiling: {top.speedup:.2f}x plain decoding at S = {top.k + 1} (S / c_v(S) with every draft token "
              f"accepted and drafting free): no drafter gets more from these forwards")
    if "draft_ms" in data:
        print(f"as a draft (reduced-vocabulary head): {data['draft_ms']:.2f} ms per step; over S rows: "
              + ", ".join(f"c({s}) = {c:.2f}" for s, c in data.get("draft_cv", {}).items()))
    return 0

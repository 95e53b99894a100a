"""`speczoo doctor`: what this machine gives speczoo, on one screen: the CPU and the features found, the
kernel path in use, the thread count (and whether it adapts to the cores free) and the compiler, the pulled models, and a measured decode speed of
the smallest pulled model.

It only reads and measures: it never pulls, packs or deletes anything (a model's first load stores its
cost profile, as any load does). A problem it finds (kernels that cannot be built, the scalar path, a
model that will not load) is printed with what to do and makes the exit status 1; it never hides one.
"""

from __future__ import annotations

import json
import os
import platform
import time

from speczoo.errors import SpeczooError

# The CPU features the kernel paths (kernels/native.py) and torch care about, per architecture.
FEATURES = {
    "x86_64": ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
               "avx_vnni", "avx512_bf16", "amx_int8"),
    "aarch64": ("asimd", "asimddp", "i8mm", "bf16", "sve", "sve2"),
}
PATH_ENV = "SPECZOO_KERNEL_PATH"
BENCH_PROMPT = "Write a Python function that tells whether a number is prime, with a docstring and two examples."
LABEL = 10      # width of the text report's labels


def register(sub) -> None:
    p = sub.add_parser("doctor", help="the CPU, kernel path, threads, compiler, pulled models and a decode speed",
                       description="Report what speczoo finds on this machine: the CPU and its features, the "
                                   "compiled kernels' path, the thread count, the compiler, the pulled models, "
                                   "and the decode speed of the smallest pulled model (greedy, measured now).")
    p.add_argument("--no-bench", action="store_true", help="skip the decode measurement")
    p.add_argument("-n", "--tokens", type=int, default=32, help="new tokens to time (default 32)")
    p.add_argument("--model", default=None, help="the model to time (default: the smallest pulled one)")
    p.add_argument("--backend", default=None, help="linear backend to time it with (default: the model's default)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.threads import ADAPT_ENV

    if args.tokens < 1:
        raise ValueError(f"--tokens must be at least 1, got {args.tokens}")
    out = Output(args.json)
    report = {"cpu": cpu_section(), "kernels": kernel_section(), "threads": threads_section(args.threads),
              "torch": {"version": _torch_version(), "python": platform.python_version()}}
    out.cpu(report["cpu"])
    out.kernels(report["kernels"])
    t = report["threads"]
    out.line("threads", f"{t['count']}, from {t['source']}; " + (
        f"fixed by {t['fixed_by']}" if t["fixed_by"] else
        f"adapts while generating, 1 to {t['count']}, to the cores another program leaves free "
        f"(--threads N or {ADAPT_ENV}=0 fix it)"))
    out.line("omp wait", report["threads"]["openmp_wait"])
    out.line("torch", f"{report['torch']['version']} (python {report['torch']['python']})")
    report["models"] = models_section(default_known="error" not in report["kernels"])
    out.models(report["models"])
    report["bench"] = None
    if not args.no_bench:
        name = args.model or smallest(report["models"])
        if name is None:
            out.line("decode", "not measured: no model is pulled (speczoo pull qwen2.5-coder-0.5b)")
        else:
            out.line("decode", f"timing {name}: {args.tokens} tokens, greedy ...")
            report["bench"] = bench_section(name, args.tokens, args.backend)
            out.bench(report["bench"])
    report["problems"] = problems(report)
    out.problems(report["problems"])
    if args.json:
        print(json.dumps(report, indent=1))
    return 1 if report["problems"] else 0


# ------------------------------------------------------------------------------------------ sections
def cpu_section() -> dict:
    from speczoo.kernels import native

    info = native.cpu_info()
    relevant = FEATURES.get(info.arch, ())
    return {"model": info.model, "name": info.describe(), "vendor": info.vendor, "family": info.family,
            "model_number": info.model_number, "arch": info.arch, "physical_cores": info.physical_cores,
            "logical_cores": info.logical_cores, "source": info.source,
            "features": [f for f in relevant if f in info.features],
            "missing": [f for f in relevant if f not in info.features]}


def kernel_section() -> dict:
    """The path chosen for this CPU and the library built for it; an "error" entry when either fails."""
    from speczoo.kernels import native

    out: dict = {"compiler": native.compiler_description(), "forced_by_env": os.environ.get(PATH_ENV) or None}
    try:
        path = native.chosen_path()
        out.update(path=path.name, simd=path.simd, flags=list(path.flags))
        t0 = time.perf_counter()
        lib = native.kernels()
        out.update(built_for=lib.path_name, threaded=lib.threaded, load_s=round(time.perf_counter() - t0, 2))
    except SpeczooError as exc:
        out["error"] = str(exc)
    return out


def threads_section(flag: int | None) -> dict:
    import torch

    from speczoo import openmp_wait
    from speczoo.threads import fixed, threads_source

    return {"count": torch.get_num_threads(), "source": threads_source(flag), "fixed_by": fixed(),
            "openmp_wait": openmp_wait.state()}


def models_section(default_known: bool = True) -> list[dict]:
    """Every pulled bundle (as `speczoo models` finds them, sources not hashed): its size, the packings
    it stores and the backend a plain load picks (unknown while the kernels fail)."""
    from speczoo.runtime import default_backend
    from speczoo.zoo.bundle import check_bundle, list_bundles

    out = []
    for d in list_bundles():
        check = check_bundle(d, hash_source=False)
        m = check.manifest
        entry = {"name": d.name, "ok": check.ok, "problem": check.reason or None}
        if m is not None:
            backend = default_backend(d) if default_known else None
            entry.update(architecture=m.architecture, source_bytes=m.source.size, packed=m.packed_backends,
                         default_backend=backend, packing=m.packing.get(backend, []))
        out.append(entry)
    return out


def smallest(models: list[dict]) -> str | None:
    """The name of the smallest sound pulled model (by its source's size), None when there is none."""
    sound = [m for m in models if m["ok"] and "source_bytes" in m]
    return min(sound, key=lambda m: m["source_bytes"])["name"] if sound else None


def bench_section(name: str, tokens: int, backend: str | None) -> dict:
    """Load `name` as every command does and time `tokens` greedy tokens after a short chat prompt
    (one short warm-up first); {"error": ...} when it cannot be loaded or run."""
    from speczoo.bench.ab import run_request
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    try:
        t0 = time.perf_counter()
        rt = load_runtime(name, backend=backend, max_seq=512)
        load_s = time.perf_counter() - t0
        ids = rt.chat_ids([{"role": "user", "content": BENCH_PROMPT}])
        run_request(rt, GenerationRequest(prompt_ids=ids, max_new_tokens=2))
        done = run_request(rt, GenerationRequest(prompt_ids=ids, max_new_tokens=tokens))
    except (SpeczooError, ValueError, FileNotFoundError) as exc:
        return {"model": name, "error": str(exc)}
    s = done.stats
    return {"model": name, "backend": rt.target.backend, "tokens": s.new_tokens, "tok_s": round(s.tok_s, 2),
            "prompt_tokens": s.prompt_tokens, "prefill_s": round(s.prefill_seconds, 3), "load_s": round(load_s, 2)}


def problems(report: dict) -> list[str]:
    """What is wrong, each with what to do."""
    out = []
    k = report["kernels"]
    if "error" in k:
        out.append(f"the compiled kernels: {k['error']}")
    elif not k["simd"]:
        why = (f"{PATH_ENV}={k['forced_by_env']} forces it; unset it for the CPU's best path" if k["forced_by_env"]
               else "this CPU has none of the features of their SIMD paths (x86: AVX2 and FMA; Arm: NEON)")
        out.append(f"the kernels run their scalar reference path, many times slower: {why}")
    for m in report["models"]:
        if not m["ok"]:
            out.append(f"model {m['name']}: {m['problem']}; `speczoo pull {m['name']} --force` rebuilds it")
    b = report["bench"]
    if b is not None and "error" in b:
        out.append(f"timing {b['model']} failed: {b['error']}")
    return out


def _torch_version() -> str:
    import torch

    return torch.__version__


# ------------------------------------------------------------------------------------------ the text
class Output:
    """The text report, printed (and flushed) section by section; silent when the report is JSON."""

    def __init__(self, as_json: bool):
        self.quiet = as_json
        if not as_json:
            print("speczoo doctor", flush=True)

    def line(self, label: str, text: str) -> None:
        if not self.quiet:
            print(f"  {label:<{LABEL}} {text}", flush=True)

    def cpu(self, c: dict) -> None:
        self.line("cpu", f"{c['name']}; {c['arch']}, {c['physical_cores']} physical cores, "
                         f"{c['logical_cores']} logical (read from {c['source']})")
        self.line("features", " ".join(c["features"]) or "none of those the kernels use")
        if c["missing"]:
            self.line("", "not found: " + " ".join(c["missing"]))

    def kernels(self, k: dict) -> None:
        if "path" in k:
            forced = f", forced by {PATH_ENV}" if k["forced_by_env"] else ""
            self.line("kernels", f"{k['path']} path ({'SIMD' if k['simd'] else 'scalar reference'}{forced}; "
                                 f"{' '.join(k['flags'])})")
        if "built_for" in k:
            self.line("", f"library built for {k['built_for']}, "
                          f"{'OpenMP threads' if k['threaded'] else 'ONE thread (built without OpenMP)'}")
        if "error" in k:
            self.line("kernels", f"FAILED: {k['error']}")
        self.line("compiler", k["compiler"])

    def models(self, models: list[dict]) -> None:
        if not models:
            self.line("models", "none pulled (speczoo pull qwen2.5-coder-0.5b)")
        for i, m in enumerate(models):
            if "source_bytes" in m:
                text = (f"{m['name']:<22} {m['architecture']:<7} {m['source_bytes'] / 1e9:5.2f} GB  "
                        f"packed: {', '.join(m['packed']) or '-'}  default backend: {m['default_backend'] or '?'}")
            else:
                text = m["name"]
            self.line("models" if i == 0 else "", text + ("" if m["ok"] else f"  BROKEN: {m['problem']}"))
            if m.get("packing"):
                from speczoo.zoo.policy import PackRow, summary
                self.line("", f"  kernel formats: {summary([PackRow.from_json(r) for r in m['packing']])}")

    def bench(self, b: dict) -> None:
        if "error" in b:
            self.line("", f"{b['model']}: FAILED: {b['error']}")
            return
        self.line("", f"{b['model']}, backend {b['backend']}: {b['tok_s']:.1f} tok/s ({b['tokens']} tokens "
                            f"greedy after a {b['prompt_tokens']}-token prompt; prefill {b['prefill_s']:.2f} s, "
                            f"load {b['load_s']:.1f} s)")

    def problems(self, found: list[str]) -> None:
        if self.quiet:
            return
        for p in found:
            print(f"  ! {p}", flush=True)
        if not found:
            print("  no problems found", flush=True)

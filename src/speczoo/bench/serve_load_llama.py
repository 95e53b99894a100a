"""llama.cpp's `llama-server` under the same load as `speczoo serve-load`, for a side-by-side figure.

`find_llama_server(explicit)` finds the binary: `--llama-server PATH`, else $SPECZOO_LLAMA_SERVER, else
`llama-server` on PATH, else /opt/llama-server-*/bin/llama-server. `LlamaServer` starts it as a
subprocess on a free loopback port with the same GGUF, `--parallel N`, a context of N x the per-slot
size (llama-server splits -c across its slots), the same threads, the model's own chat template
(`--jinja`) and its own prompt cache as it comes by default (speczoo's batch reuses prompt prefixes
across its slots too), waits for /health, and stops it when the `with` block ends, on an error or
Ctrl-C as well (terminate, then kill); on Linux the child also dies with its parent.
`LlamaComparison.compare(ours)` sends the request bodies of speczoo's runs at one client count
(speczoo-only fields dropped), each alone and then all at once, through `serve_load.run_clients`,
exactly as speczoo's run, once per llama-server mode (speczoo.bench.llama_modes: greedy first, then
ngram-mod, ngram-simple, draft; a fresh server each), and returns llama's figures to print beside
speczoo's: aggregate tok/s (completion tokens from llama's own usage chunk over the concurrent wall time,
prefill included), TTFT and TPOT p50/p95, how many concurrent answers have the text of llama's own solo
answers, and, for a speculative mode, how many of its solo answers have the text of llama greedy's.

This module never builds or installs llama.cpp, never binds beyond 127.0.0.1, and never judges
speczoo by llama's answers: llama's counts are reported, not enforced.
"""

from __future__ import annotations

import ctypes
import glob
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from speczoo.bench.llama_modes import DRAFT_N_MAX, mode_args
from speczoo.bench.serve_load import LoadResult, StreamResult, run_clients

ENV = "SPECZOO_LLAMA_SERVER"
TOOL = "llama-server"
OPT_GLOB = "/opt/llama-server-*/bin/llama-server"
SPECZOO_ONLY = ("speculative",)     # request fields llama-server does not know
HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1


def find_llama_server(explicit: str | None = None) -> str | None:
    """The llama-server binary to run (see the module doc), None when there is none.

    A path that was named (--llama-server or $SPECZOO_LLAMA_SERVER) but does not exist is an error."""
    for named, origin in ((explicit, "--llama-server"), (os.environ.get(ENV), f"${ENV}")):
        if named:
            found = named if Path(named).is_file() else shutil.which(named)
            if found is None:
                raise FileNotFoundError(f"{origin} {named} is neither a file nor a command on PATH")
            return found
    return shutil.which(TOOL) or next(iter(sorted(glob.glob(OPT_GLOB))), None)


def llama_body(body: dict) -> dict:
    """speczoo's chat request as llama-server gets it: speczoo-only fields dropped."""
    return {k: v for k, v in body.items() if k not in SPECZOO_ONLY}


def _die_with_parent():
    """A function for the child to call before exec (Linux): SIGTERM when the parent dies, so no server
    outlives a killed run. prctl is looked up here, in the parent: the child only calls it."""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class LlamaServer:
    """`with LlamaServer(...) as s:` llama-server listening on s.host:s.port until the block ends."""

    def __init__(self, binary: str, gguf: Path, parallel: int, slot_ctx: int, threads: int,
                 alias: str, start_timeout: float = 600.0, extra_args: tuple[str, ...] = ()):
        self.binary, self.gguf, self.alias = binary, Path(gguf), alias
        self.extra_args = tuple(extra_args)     # e.g. a speculative mode's flags
        self.parallel, self.slot_ctx, self.threads = parallel, slot_ctx, threads
        self.start_timeout = start_timeout
        self.host, self.port = HOST, 0
        self._proc: subprocess.Popen | None = None
        self._log = None

    def command(self) -> list[str]:
        t = str(self.threads)
        return [self.binary, "-m", str(self.gguf), "--host", self.host, "--port", str(self.port),
                "--alias", self.alias, "--parallel", str(self.parallel), "--no-kv-unified",
                "-c", str(self.parallel * self.slot_ctx), "--threads", t, "--threads-batch", t,
                "--jinja", "--temp", "0", "--seed", "0", "--no-webui", *self.extra_args]

    def __enter__(self) -> "LlamaServer":
        with socket.socket() as sock:       # a free port; llama-server binds it right after
            sock.bind((self.host, 0))
            self.port = sock.getsockname()[1]
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent())
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{TOOL} exited with status {self._proc.returncode} while starting; "
                                   f"its last lines:\n{self.log_tail()}")
            conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass                        # not listening yet
            finally:
                conn.close()
            time.sleep(0.2)
        raise TimeoutError(f"{TOOL} did not answer /health within {self.start_timeout:.0f} s; "
                           f"its last lines:\n{self.log_tail()}")

    def log_tail(self, lines: int = 12) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").strip().splitlines()[-lines:])

    def __exit__(self, *exc) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def same_text(a: list[StreamResult], b: list[StreamResult]) -> int:
    """How many answers of `b` have the text of the answer at the same place in `a`."""
    return sum(x.text == y.text for x, y in zip(a, b))


@dataclass
class LlamaComparison:
    """llama-server on the same GGUF and requests as a speczoo run; one fresh server per mode per `compare`."""

    binary: str
    gguf: Path
    parallel: int
    slot_ctx: int
    threads: int
    alias: str
    modes: tuple[str, ...] = ("greedy",)           # greedy first: the others are judged against it
    draft_gguf: Path | None = None
    draft_max: int = DRAFT_N_MAX
    alone: dict[str, list[StreamResult]] = field(default_factory=dict)   # solo answers per mode, reused

    def run(self, bodies: list[dict], mode: str = "greedy") -> LoadResult:
        bodies = [llama_body(b) for b in bodies]
        with LlamaServer(self.binary, self.gguf, self.parallel, self.slot_ctx, self.threads, self.alias,
                         extra_args=tuple(mode_args(mode, self.threads, self.draft_gguf, self.draft_max))
                         ) as server:
            alone, together, wall = run_clients(server.host, server.port, bodies, None, self.alone.get(mode))
        if len(alone) > len(self.alone.get(mode, [])):
            self.alone[mode] = alone
        return LoadResult(model=self.alias, spec="llama.cpp" if mode == "greedy" else f"llama.cpp {mode}",
                          max_tokens=bodies[0]["max_tokens"], alone=alone, together=together,
                          wall_seconds=wall, parallel=self.parallel, bodies=bodies)

    def compare(self, ours: list[LoadResult]) -> list[str]:
        """Run llama-server in each mode on the requests of `ours` (speczoo's runs at one client count,
        one per --spec mode: the same prompts); its lines and the speczoo/llama ratio of each run."""
        greedy = self.run(ours[0].bodies, "greedy")
        lines = comparison_lines(ours, greedy)
        for mode in self.modes:
            if mode != "greedy":
                lines += mode_lines(ours, self.run(ours[0].bodies, mode), greedy, mode)
        return lines


def _ratios(ours: list[LoadResult], llama: LoadResult, name: str) -> list[str]:
    lines = []
    for run in ours:
        ratio = (f"{run.aggregate_tok_s / llama.aggregate_tok_s:.2f}x" if llama.tokens
                 else "n/a (llama sent no tokens)")
        lines.append(f"speczoo/{name} aggregate: {ratio}" + (f" (spec {run.spec})" if len(ours) > 1 else ""))
    return lines


def comparison_lines(ours: list[LoadResult], llama: LoadResult) -> list[str]:
    n = llama.clients
    full = sum(t.completion_tokens == llama.max_tokens for t in llama.together)
    return [
        f"llama-server --parallel {llama.parallel}, same GGUF and requests: {full}/{n} used their whole "
        f"budget; LLAMA IDENTICAL {same_text(llama.alone, llama.together)}/{n} (each concurrent answer vs "
        f"llama's own solo answer); llama's solo answers equal speczoo's: {same_text(ours[0].alone, llama.alone)}/{n}",
        f"llama {llama.aggregate_line()}",
        f"llama {llama.percentiles_line()}",
        *_ratios(ours, llama, "llama"),
    ]


def mode_lines(ours: list[LoadResult], llama: LoadResult, greedy: LoadResult, mode: str) -> list[str]:
    """A speculative mode's lines: its concurrent answers vs its solo ones, its solo answers vs llama
    greedy's (lossless as llama.cpp's own greedy defines it), its figures, speczoo's ratio to it."""
    n = llama.clients
    return [
        f"llama-server {mode} --parallel {llama.parallel}: LLAMA {mode.upper()} IDENTICAL "
        f"{same_text(llama.alone, llama.together)}/{n} (concurrent vs its solo answers); EQUALS LLAMA GREEDY "
        f"{same_text(greedy.alone, llama.alone)}/{n} (its solo answers vs llama greedy's)",
        f"llama {mode} {llama.aggregate_line()}",
        f"llama {mode} {llama.percentiles_line()}",
        *_ratios(ours, llama, f"llama {mode}"),
    ]

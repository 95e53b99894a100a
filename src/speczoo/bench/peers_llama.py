"""llama.cpp as a peer of `speczoo peers`: its `llama-server`, one server per mode, fed speczoo's prompt ids.

`LlamaServerFamily` ("llama") runs the llama-server that benchmarks/build_llama.sh builds (found as
serve_load_llama.find_llama_server finds it: --llama-server PATH, $SPECZOO_LLAMA_SERVER, PATH,
/opt/llama-server-*/bin) in the modes of speczoo.bench.llama_modes: greedy (the family's reference),
ngram-mod, ngram-simple and, with a draft model, draft. Each mode is its own server on loopback
(serve_load_llama.LlamaServer), on the target GGUF, one slot, the same threads, started when the mode
first answers and stopped when the family closes. Every answer is one greedy `/completion` on the prompt's
ids (speczoo.bench.llama_completion), so a mode's output is judged by ids against llama:greedy's, and
its seconds are llama-server's own `predicted_ms` (timing "reported").

This module never builds llama.cpp, never binds beyond 127.0.0.1, and never leaves a server running
after `close()`.
"""

from __future__ import annotations

from contextlib import ExitStack

from speczoo.bench.llama_completion import LlamaAnswer, completion_body, post_completion
from speczoo.bench.llama_modes import MODES, NGRAM_N_MAX, mode_args
from speczoo.bench.peers import PeerError, PeerOutput, PeerPrompt, PeerSettings, timed_tokens
from speczoo.bench.serve_load_llama import LlamaServer, find_llama_server

BUILD_HINT = ("no llama-server found: build one with `bash benchmarks/build_llama.sh` and pass "
              "--llama-server DIR/llama-server (or set $SPECZOO_LLAMA_SERVER)")


class LlamaServerFamily:
    name = "llama"
    warm_up = True

    def __init__(self, settings: PeerSettings):
        self.settings = settings
        try:
            self.binary = find_llama_server(settings.llama_server)
        except FileNotFoundError as exc:
            raise PeerError(str(exc)) from None
        if self.binary is None:
            raise PeerError(BUILD_HINT)
        self._servers: dict[str, LlamaServer] = {}
        self._stack = ExitStack()

    def methods(self) -> list[str]:
        return [m for m in MODES if m != "draft" or self.settings.draft_gguf is not None]

    def args(self, method: str) -> list[str]:
        s = self.settings
        return mode_args(method, s.threads, s.draft_gguf)

    def describe(self, method: str) -> str:
        flags = " ".join(a for a in self.args(method) if "/" not in a)     # no paths in the table
        return f"llama-server {flags}".rstrip() if flags else "llama-server, plain greedy"

    def reference(self, method: str) -> tuple[str, str] | None:
        return None if method == "greedy" else ("llama:greedy", "ids")

    def open(self) -> None:
        pass

    def _server(self, method: str) -> LlamaServer:
        if method not in self._servers:
            s = self.settings
            self._servers[method] = self._stack.enter_context(LlamaServer(
                self.binary, s.target_gguf, parallel=1, slot_ctx=s.n_ctx + NGRAM_N_MAX, threads=s.threads,
                alias=s.target, extra_args=tuple(self.args(method))))
        return self._servers[method]

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        server = self._server(method)
        a = LlamaAnswer.of(post_completion(server.host, server.port, completion_body(prompt.ids, max_new_tokens)),
                           self.settings.eos_ids)
        return PeerOutput(ids=a.ids, text=a.text, finish=a.finish, seconds=a.predicted_seconds,
                          tokens=timed_tokens(len(a.ids), a.finish),
                          total_seconds=a.prompt_seconds + a.predicted_seconds, timing="reported",
                          drafted=a.drafted, accepted=a.accepted)

    def close(self) -> None:
        self._stack.close()
        self._servers.clear()

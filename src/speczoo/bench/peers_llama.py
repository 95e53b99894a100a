"""The llama.cpp peers of `speczoo peers`: llama-cpp-python in process, and llama.cpp's own tool.

* `LlamaCppFamily` ("llama"): `llama_cpp.Llama` on the target GGUF, greedy (temperature 0, top-k 1, no
  repeat penalty), fed speczoo's prompt ids; "greedy" plainly, "lookup" with its prompt-lookup drafter
  (`LlamaPromptLookupDecoding(num_pred_tokens=K)`, which needs `logits_all=True`). Each method owns one
  `Llama` (the weights are memory-mapped, so the second costs little). Its KV cache is cleared before
  every answer so that no prompt is served from an earlier one.
* `LlamaCliFamily` ("llama-cli"): `llama-speculative-simple`, when it is on PATH (or named with
  --llama-cli), run once per answer in a subprocess with the draft model (`draft-simple`, K drafted)
  and its n-gram modes (`ngram-simple`, `ngram-mod`, their default sizes). It prints text, not ids, and
  times itself: rows use its own "decoded N tokens in S seconds" line, and its text is judged against
  llama:greedy's text (lossless when equal, or when greedy stopped at the token limit and the tool's
  longer answer starts with greedy's text: the tool may run past -n by up to one draft).

This module never installs llama.cpp and never guesses a tool's output: text it cannot parse is a
PeerError that shows the tool's last lines.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from speczoo.bench.peers import (
    INSTALL_HINT, PeerOutput, PeerError, PeerPrompt, PeerSettings, timed_tokens)

TOOL = "llama-speculative-simple"
BUILD_HINT = (f"{TOOL} is not on PATH: build it from llama.cpp (cmake -B build && cmake --build build "
              f"--target {TOOL} -j 2) and put build/bin on PATH, or pass --llama-cli PATH")


def _import_llama_cpp():
    try:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as exc:
        raise PeerError(f"llama-cpp-python cannot be imported ({exc}); {INSTALL_HINT}") from None
    return llama_cpp, LlamaPromptLookupDecoding


class LlamaCppFamily:
    name = "llama"
    warm_up = True

    def __init__(self, settings: PeerSettings):
        self.settings = settings
        self._llms: dict[str, object] = {}
        self._module = None

    def methods(self) -> list[str]:
        return ["greedy", "lookup"]

    def describe(self, method: str) -> str:
        return {"greedy": "llama-cpp-python, plain greedy",
                "lookup": f"llama-cpp-python, LlamaPromptLookupDecoding(num_pred_tokens={self.settings.k})"
                }[method]

    def reference(self, method: str) -> tuple[str, str] | None:
        return None if method == "greedy" else ("llama:greedy", "ids")

    def open(self) -> None:
        self._module = _import_llama_cpp()

    def _llm(self, method: str):
        if method not in self._llms:
            llama_cpp, lookup_cls = self._module
            s = self.settings
            lookup = method == "lookup"
            self._llms[method] = llama_cpp.Llama(
                model_path=str(s.target_gguf), n_ctx=s.n_ctx, n_batch=512, n_threads=s.threads,
                n_threads_batch=s.threads, seed=0, verbose=False, logits_all=lookup,
                draft_model=lookup_cls(num_pred_tokens=s.k) if lookup else None)
        return self._llms[method]

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        llm = self._llm(method)
        n = max_new_tokens
        eos = set(self.settings.eos_ids)
        llm.reset()
        ids: list[int] = []
        finish = "length"
        t0 = time.perf_counter()
        t_first = None
        stream = llm.generate(list(prompt.ids), top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                              repeat_penalty=1.0, reset=True)
        try:
            for token in stream:
                if t_first is None:
                    t_first = time.perf_counter()
                if int(token) in eos:
                    finish = "stop"
                    break
                ids.append(int(token))
                if len(ids) >= n:
                    break
        finally:
            stream.close()
        t_end = time.perf_counter()
        text = llm.detokenize(ids).decode("utf-8", errors="replace")
        return PeerOutput(ids=ids, text=text, finish=finish, seconds=t_end - (t_first or t_end),
                          tokens=timed_tokens(len(ids), finish), total_seconds=t_end - t0,
                          timing="first-token")

    def close(self) -> None:
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()


# -- llama.cpp's own tool --------------------------------------------------------------------------

DECODED = re.compile(r"decoded\s+(\d+)\s+tokens\s+in\s+([\d.]+)\s+seconds")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
TRAILER = "\n\n\n\n"          # the tool prints "\n\n" after the answer and again at exit


def find_tool(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() else shutil.which(explicit)
    return shutil.which(TOOL)


def parse_tool_output(stdout: str, stderr: str, prompt_text: str) -> tuple[str, int, float, int, int]:
    """(answer text, decoded tokens, decode seconds, drafted, accepted) from llama-speculative-simple.

    stdout is "\\n\\n" + the prompt's pieces + the answer + "\\n\\n" + "\\n\\n"; the figures are on stderr.
    """
    tail = "\n".join(stderr.strip().splitlines()[-8:])
    m = DECODED.search(stderr)
    if m is None:
        raise PeerError(f"{TOOL} printed no 'decoded N tokens in S seconds' line; its last lines:\n{tail}")
    at = stdout.find(prompt_text)
    if at < 0:
        raise PeerError(f"{TOOL} did not echo the prompt on stdout, so its answer cannot be cut out; "
                        f"stdout starts {stdout[:200]!r}")
    text = stdout[at + len(prompt_text):].removesuffix(TRAILER)
    drafted, accepted = DRAFTED.search(stderr), ACCEPTED.search(stderr)
    return (text, int(m.group(1)), float(m.group(2)),
            int(drafted.group(1)) if drafted else 0, int(accepted.group(1)) if accepted else 0)


class LlamaCliFamily:
    name = "llama-cli"
    warm_up = False           # each answer is a fresh process, and the tool warms itself up

    def __init__(self, settings: PeerSettings, runner=subprocess.run):
        self.settings = settings
        self.tool = find_tool(settings.llama_cli)
        if self.tool is None:
            raise PeerError(BUILD_HINT if not settings.llama_cli else
                            f"--llama-cli {settings.llama_cli} is neither a file nor on PATH")
        self.runner = runner

    def methods(self) -> list[str]:
        return [*(["draft"] if self.settings.draft_gguf else []), "ngram-simple", "ngram-mod"]

    def describe(self, method: str) -> str:
        if method == "draft":
            return f"{TOOL} --spec-type draft-simple, draft {self.settings.draft}, K {self.settings.k}"
        return f"{TOOL} --spec-type {method} (default sizes)"

    def reference(self, method: str) -> tuple[str, str] | None:
        return ("llama:greedy", "text")

    def open(self) -> None:
        pass

    def command(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> list[str]:
        s = self.settings
        cmd = [self.tool, "-m", str(s.target_gguf), "-p", prompt.text, "-n", str(max_new_tokens),
               "-c", str(s.n_ctx), "-t", str(s.threads), "-tb", str(s.threads), "--temp", "0",
               "--top-k", "1", "--seed", "0"]
        if method == "draft":
            cmd += ["--spec-type", "draft-simple", "-md", str(s.draft_gguf), "--spec-draft-n-max", str(s.k),
                    "-td", str(s.threads), "-tbd", str(s.threads)]
        else:
            cmd += ["--spec-type", method]
        return cmd

    def generate(self, method: str, prompt: PeerPrompt, max_new_tokens: int) -> PeerOutput:
        cmd = self.command(method, prompt, max_new_tokens)
        t0 = time.perf_counter()
        try:
            done = self.runner(cmd, capture_output=True, text=True, errors="replace", timeout=900)
        except subprocess.TimeoutExpired:
            raise PeerError(f"{TOOL} ({method}) ran over 900 s on question {prompt.question_id}") from None
        total = time.perf_counter() - t0
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise PeerError(f"{TOOL} ({method}) exited with status {done.returncode}; its last lines:\n{tail}")
        text, n, seconds, drafted, accepted = parse_tool_output(done.stdout, done.stderr, prompt.text)
        finish = "length" if n >= max_new_tokens else "stop"
        return PeerOutput(ids=[], text=text, finish=finish, seconds=seconds, tokens=n, new_tokens=n,
                          total_seconds=total, timing="reported", drafted=drafted, accepted=accepted)

    def close(self) -> None:
        pass


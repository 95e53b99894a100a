"""One OpenAI-compatible server reached by URL, as `speczoo suite --endpoint` drives it: one timed answer.

`parse_endpoint("http://127.0.0.1:8080,llama:ngram-mod,top_k=1")` → `Endpoint`: the server's URL, the
label its rows carry (SYSTEM:MODE; a mode named `greedy` or `off` marks the system's greedy reference),
and extra request fields (KEY=VALUE, the value read as JSON where it parses, e.g. speczoo serve's
`speculative=ngram`, a `model=NAME`). `EndpointClient(endpoint)` talks to it through the official
`openai` client (no retries): `model` is the body's, else the first of GET /v1/models; `complete(prompt,
max_tokens)` streams one /v1/completions answer at temperature 0 with usage asked for, and times the
chunks as they arrive: request → first text (the prefill as a client sees it), first text → the chunk
that carries finish_reason (the decode), request → that chunk (the whole answer).

This module never starts or stops a server, never retries (a failure is an EndpointError naming the
endpoint and what to check), and never judges an answer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from speczoo.errors import SpeczooError

GREEDY_MODES = ("greedy", "off")       # a label SYSTEM:MODE with one of these is its system's reference
KEY_ENV = "OPENAI_API_KEY"             # the bearer key sent, when the server wants one
TIMEOUT = 1800.0                       # seconds one answer may take on a loaded machine


class EndpointError(SpeczooError):
    """An endpoint could not be reached or answered with an error; says which and what to check."""


@dataclass(frozen=True)
class Endpoint:
    url: str                   # as given, without a trailing slash
    label: str                 # SYSTEM:MODE, the `method` of its rows
    body: dict = field(default_factory=dict, hash=False)   # extra request fields

    @property
    def system(self) -> str:
        return self.label.partition(":")[0]

    @property
    def mode(self) -> str:
        return self.label.partition(":")[2]

    @property
    def greedy(self) -> bool:
        return self.mode in GREEDY_MODES

    @property
    def base_url(self) -> str:
        """The URL the client is given: .../v1 (added when the URL does not end with it)."""
        return self.url if self.url.endswith("/v1") else self.url + "/v1"


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_endpoint(spec: str, index: int = 1) -> Endpoint:
    """ "URL[,LABEL[,KEY=VALUE...]]" → Endpoint; without a label, `server{index}:greedy`."""
    url, *rest = [part.strip() for part in spec.split(",")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint {spec!r}: the URL must start with http:// or https:// "
                         "(e.g. http://127.0.0.1:8080,llama:greedy)")
    label = rest.pop(0) if rest and "=" not in rest[0] else f"server{index}:greedy"
    system, _, mode = label.partition(":")
    if not system or not mode:
        raise ValueError(f"--endpoint {spec!r}: the label must be SYSTEM:MODE (e.g. vllm:greedy, vllm:ngram); "
                         f"got {label!r}")
    body = {}
    for item in rest:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--endpoint {spec!r}: {item!r} is not KEY=VALUE (extra request fields come after "
                             "the label, e.g. speculative=ngram)")
        body[key] = _value(value)
    return Endpoint(url=url.rstrip("/"), label=label, body=body)


@dataclass
class StreamedAnswer:
    text: str
    finish: str                       # the server's finish_reason ("stop", "length")
    completion_tokens: int | None     # from the usage chunk; None when the server sent none
    prompt_tokens: int | None
    first_seconds: float              # request sent → first chunk with text
    decode_seconds: float             # first text → the chunk with finish_reason
    total_seconds: float              # request sent → the chunk with finish_reason
    usage: dict = field(default_factory=dict)    # the usage chunk as sent (speczoo's has drafted/accepted)


def _import_openai():
    try:
        import openai
    except ImportError:
        raise EndpointError("measuring a server by URL needs the official openai client: "
                            "pip install -e '.[bench]' -c constraints.txt") from None
    return openai


class EndpointClient:
    def __init__(self, endpoint: Endpoint, timeout: float = TIMEOUT):
        openai = _import_openai()
        self.endpoint = endpoint
        self._openai = openai
        self.client = openai.OpenAI(base_url=endpoint.base_url, api_key=os.environ.get(KEY_ENV, "none"),
                                    max_retries=0, timeout=timeout)
        self.body = dict(endpoint.body)
        self.model = self.body.pop("model", None) or self._served_model()

    def _fail(self, exc: Exception, doing: str) -> EndpointError:
        ep = self.endpoint
        where = f"endpoint {ep.label} ({ep.base_url})"
        if isinstance(exc, self._openai.APIStatusError):
            return EndpointError(f"{where} answered {doing} with HTTP {exc.status_code}: {exc.message}")
        if isinstance(exc, self._openai.APIConnectionError):
            return EndpointError(f"{where} could not be reached for {doing} ({exc.__cause__ or exc}); is its "
                                 "server running at that URL?")
        return EndpointError(f"{where} failed {doing}: {exc}")

    def _served_model(self) -> str:
        try:
            models = self.client.models.list().data
        except self._openai.OpenAIError as exc:
            raise self._fail(exc, "GET /v1/models") from None
        if not models:
            raise EndpointError(f"endpoint {self.endpoint.label} ({self.endpoint.base_url}) serves no model; name "
                                "one with model=NAME after the label")
        return models[0].id

    def complete(self, prompt: str | list[int], max_tokens: int) -> StreamedAnswer:
        """One greedy answer to `prompt`, streamed and timed (see the module doc)."""
        parts: list[str] = []
        finish, usage = None, None
        t0 = time.perf_counter()
        t_first = t_end = None
        try:
            stream = self.client.completions.create(
                model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body=self.body or None)
            for chunk in stream:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
                for choice in chunk.choices:
                    if choice.text:
                        t_first = t_first if t_first is not None else now
                        parts.append(choice.text)
                    if choice.finish_reason and finish is None:
                        finish, t_end = choice.finish_reason, now
                t_end = t_end if finish is not None else now
        except self._openai.OpenAIError as exc:
            raise self._fail(exc, "POST /v1/completions") from None
        if t_end is None:
            raise EndpointError(f"endpoint {self.endpoint.label} ({self.endpoint.base_url}) streamed nothing for "
                                "a /v1/completions request")
        t_first = t_first if t_first is not None else t_end
        return StreamedAnswer(text="".join(parts), finish=finish or "length",
                              completion_tokens=usage.get("completion_tokens") if usage else None,
                              prompt_tokens=usage.get("prompt_tokens") if usage else None,
                              first_seconds=t_first - t0, decode_seconds=t_end - t_first, total_seconds=t_end - t0,
                              usage=usage or {})

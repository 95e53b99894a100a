"""Ollama's API beside OpenAI's: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version.

Many local tools speak only Ollama; pointed at `speczoo serve` they work unchanged. A generation takes
the OpenAI routes' path (generation.py: the same checks, the same worker queue, the same cancellation
when the client leaves), with speculation as the server's --spec or `options.speculative`, so the
answer is lossless. Streaming (Ollama's default) is newline-delimited JSON; durations are in
nanoseconds; errors are Ollama's `{"error": "..."}` (api_errors.py shapes them by path). The wire
format of requests is ollama_schemas.py. This module never runs a model and never holds KV state.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from speczoo.chat import render_chat_prompt
from speczoo.decoding.prompt_checks import check_ids
from speczoo.errors import SpeczooError
from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.serve.api_errors import APIError, runtime_error
from speczoo.serve.generation import Generations, Params
from speczoo.serve.logprobs import LogprobTrack, chat_content
from speczoo.serve.ollama_schemas import ChatRequest, GenerateRequest, ShowRequest, GenerationFields
from speczoo.serve.sse import EventStreamResponse
from speczoo.serve.structured import ollama_format
from speczoo.serve.worker import Job

VERSION = "0.12.6"          # the Ollama release whose API this follows (what GET /api/version reports)
OPTIONS = Params(max_tokens="options.num_predict", stop="options.stop", speculative="options.speculative")


class NDJSONResponse(EventStreamResponse):
    """A stream of JSON objects, one a line (Ollama's streaming), cancelled when the client leaves."""

    media_type = "application/x-ndjson"


def ndjson(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def now() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class Answer:
    """What differs between /api/chat and /api/generate: where the text goes in a line, and what the
    last line adds (generate: the `context` to go on from)."""

    def __init__(self, chat: bool, prompt_ids: list[int]):
        self.chat, self.prompt_ids = chat, prompt_ids

    def text(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}

    def end(self, done: DoneEvent) -> dict:
        return {} if self.chat else {"context": self.prompt_ids + done.ids}


def ollama_routes(gens: Generations) -> APIRouter:
    """The Ollama routes over the server's shared generation path `gens`."""
    router = APIRouter(prefix="/api", include_in_schema=False)
    runtime = gens.runtime
    facts = runtime.facts()              # read once: the served model does not change

    def check_model(model: str) -> None:
        if model not in (runtime.name, f"{runtime.name}:latest"):
            raise APIError(404, f"model {model!r} not found; this server serves {runtime.name!r} (GET /api/tags)",
                           "not_found_error", "model")

    def details() -> dict:
        return {"parent_model": "", "format": "gguf", "family": facts.arch, "families": [facts.arch],
                "parameter_size": "", "quantization_level": facts.quantization}

    def listing() -> dict:
        return {"name": runtime.name, "model": runtime.name, "modified_at": facts.modified, "size": facts.size,
                "digest": facts.digest, "details": details()}

    @router.get("/version")
    async def version() -> dict:
        return {"version": VERSION}

    @router.get("/tags")
    async def tags() -> dict:
        return {"models": [listing()]}

    @router.get("/ps")
    async def ps() -> dict:
        return {"models": [{**listing(), "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0,
                            "context_length": facts.context}]}

    @router.post("/show")
    async def show(body: ShowRequest) -> dict:
        check_model(body.model or body.name or "")
        return {"modelfile": f"# served by speczoo\nFROM {runtime.name}\n", "parameters": "",
                "template": facts.chat_template, "details": details(), "modified_at": facts.modified, "capabilities": ["completion"],
                "model_info": {"general.architecture": facts.arch, f"{facts.arch}.context_length": facts.context}}

    @router.post("/chat")
    async def chat(body: ChatRequest, request: Request):
        check_model(body.model)
        refuse_unsupported(body)
        if body.tools:
            raise APIError(400, "tools are not supported on /api/chat yet", param="tools")
        for m in body.messages:
            if m.images or m.tool_calls or m.role == "tool":
                raise APIError(400, "images, tool calls and tool messages are not supported on /api/chat yet",
                               param="messages")
        if not body.messages:
            return loaded(body.model, {"message": {"role": "assistant", "content": ""}})
        ids = prompt_ids([{"role": m.role, "content": m.content} for m in body.messages])
        return await respond(body, request, Answer(chat=True, prompt_ids=ids))

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        check_model(body.model)
        refuse_unsupported(body)
        if body.suffix or body.template:
            raise APIError(400, "suffix and template are not supported on /api/generate", param="suffix")
        if not body.prompt:
            return loaded(body.model, {"response": ""})
        if body.raw:
            ids = runtime.tokenizer.encode(body.prompt)
        else:
            ids = prompt_ids(([{"role": "system", "content": body.system}] if body.system else [])
                             + [{"role": "user", "content": body.prompt}])
        if body.context:
            try:
                check_ids(body.context, runtime.vocab_size, runtime.name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="context") from None
        return await respond(body, request, Answer(chat=False, prompt_ids=list(body.context or []) + ids))

    def refuse_unsupported(body: GenerationFields) -> None:
        if body.images:
            raise APIError(400, "images are not supported: the served model reads text only", param="images")

    def prompt_ids(messages: list[dict]) -> list[int]:
        tok = runtime.tokenizer
        try:
            return tok.encode(render_chat_prompt(tok, messages))
        except (ValueError, SpeczooError) as exc:      # e.g. a template that rejects the role order
            raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from exc

    def loaded(model: str, empty: dict) -> dict:
        """Ollama's answer to a request without a prompt: the model is loaded (it always is here)."""
        return {"model": model, "created_at": now(), **empty, "done": True, "done_reason": "load"}

    async def respond(body: GenerationFields, request: Request, answer: Answer):
        started = time.perf_counter_ns()
        req = generation_request(body, answer.prompt_ids)
        job = gens.submit(req, request)
        track = gens.track(req)
        if body.stream:
            return NDJSONResponse(stream(job, body.model, answer, track, started))
        done = await gens.collect(request, job)
        line = {"model": body.model, "created_at": now(), **answer.text(done.text)}
        if track is not None:
            line["logprobs"] = chat_content(track.whole(done))
        return JSONResponse({**line, **final(done, answer, started)})

    def generation_request(body: GenerationFields, ids: list[int]) -> GenerationRequest:
        o = body.options
        try:
            logprobs = body.logprob_count()
        except ValueError as exc:
            raise APIError(400, str(exc), param="top_logprobs") from None
        return gens.generation(ids, o.max_tokens(), stop=o.stop_list(), spec=o.speculative, logprobs=logprobs,
                               sampling=SamplingParams(temperature=o.temperature, top_k=o.top_k, top_p=o.top_p,
                                                       seed=o.seed), params=OPTIONS,
                               constraint=ollama_format(body.format))

    async def stream(job: Job, model: str, answer: Answer, track: LogprobTrack | None,
                     started: int) -> AsyncIterator[str]:
        events = gens.worker.events(job)
        try:
            async for event in events:
                line = {"model": model, "created_at": now()}
                if isinstance(event, TokenEvent):
                    line |= {**answer.text(event.text), "done": False}
                elif isinstance(event, DoneEvent):
                    line |= {**answer.text(""), **final(event, answer, started)}
                if track is not None:
                    line["logprobs"] = chat_content(track.streamed(event))
                yield ndjson(line)
        except Exception as exc:  # noqa: BLE001 - the status line is sent: report in-band, as Ollama does
            yield ndjson({"error": runtime_error(exc).message})
        finally:
            await events.aclose()       # cancels the job if we stopped early (client gone)

    return router


def final(done: DoneEvent, answer: Answer, started: int) -> dict:
    """The last line's fields: why it ended, the durations (ns) and counts, and speczoo's round stats."""
    s = done.stats
    return {"done": True, "done_reason": done.finish_reason, **answer.end(done),
            "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
            "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": int(s.prefill_seconds * 1e9),
            "eval_count": len(done.ids), "eval_duration": int(s.seconds * 1e9),
            "speczoo": {"drafter": s.drafter, "rounds": s.rounds, "draft_tokens": s.drafted,
                        "accepted_draft_tokens": s.accepted}}

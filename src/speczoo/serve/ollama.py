"""Ollama's API beside OpenAI's: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version.

Many local tools speak only Ollama; pointed at `speczoo serve` they work unchanged. A generation takes
the OpenAI routes' path (generation.py: the same checks, the same worker queue, the same cancellation
when the client leaves), with speculation as the server's --spec or `options.speculative`, so the
answer is lossless. `tools` on /api/chat take the OpenAI route's path too: Ollama's turns become its
messages (ollama_schemas.py), rendered through the model's own template by tool_prompt.py, and the
model's calls are read by tool_calls.py into Ollama's `message.tool_calls` (arguments as objects), a
streamed call whole in one line; a malformed call stays in `content`, and the last line's `speczoo`
says why. Streaming (Ollama's default) is newline-delimited JSON; durations are in
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

from speczoo.decoding.prompt_checks import check_ids
from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.serve.api_errors import APIError, runtime_error
from speczoo.serve.generation import Generations, Params
from speczoo.serve.logprobs import LogprobTrack, chat_content
from speczoo.serve.ollama_schemas import ChatRequest, GenerateRequest, GenerationFields, ShowRequest
from speczoo.serve.schemas import ChatMessage
from speczoo.serve.sse import EventStreamResponse
from speczoo.serve.structured import ollama_format
from speczoo.serve.tool_formats import UnknownToolFormat, detect_format
from speczoo.serve.tool_prompt import ToolPlan, chat_prompt_ids, plan
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
    last line adds (generate: the `context` to go on from). A chat with tools reads the model's calls out
    of its text (tool_calls.py, as the OpenAI route does) into Ollama's `message.tool_calls`."""

    def __init__(self, chat: bool, prompt_ids: list[int], tools: ToolPlan | None = None):
        self.chat, self.prompt_ids, self.tools = chat, prompt_ids, tools
        self.parser = tools.parser() if tools is not None else None   # a stream's, fed as it goes
        self.error: str | None = None       # why tool-call text was not returned as a call

    def text(self, text: str, calls: list[dict] | None = None) -> dict:
        if not self.chat:
            return {"response": text}
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [ollama_call(c) for c in calls]
        return {"message": message}

    def whole(self, text: str) -> dict:
        """The fields of a whole answer `text`."""
        if self.tools is None:
            return self.text(text)
        read = self.tools.read(text)
        self.error = read.error
        return self.text(read.content or "", read.calls)

    def piece(self, text: str) -> dict:
        """The fields of a streamed piece: with tools, what the parser can show of it so far."""
        if self.parser is None:
            return self.text(text)
        delta = self.parser.feed(text)
        return self.text(delta.content, delta.calls)

    def last_piece(self) -> dict:
        """The last line's text: with tools, what the parser held back (a call the model did not close)."""
        if self.parser is None:
            return self.text("")
        delta = self.parser.finish()
        self.error = self.parser.answer_error()
        return self.text(delta.content, delta.calls)

    def end(self, done: DoneEvent) -> dict:
        return {} if self.chat else {"context": self.prompt_ids + done.ids}


def speaks_tools(template: str | None) -> bool:
    """Whether a chat template defines tool calls in a format speczoo reads (/api/show's "tools" capability)."""
    try:
        return detect_format(template) is not None
    except UnknownToolFormat:
        return False


def ollama_call(call: dict) -> dict:
    """An OpenAI tool_call dict (tool_calls.py's) in Ollama's shape: the arguments an object, not a string."""
    return {"function": {"index": call["index"], "name": call["function"]["name"],
                         "arguments": json.loads(call["function"]["arguments"])}}


def ollama_routes(gens: Generations) -> APIRouter:
    """The Ollama routes over the server's shared generation path `gens`."""
    router = APIRouter(prefix="/api", include_in_schema=False)
    runtime = gens.runtime
    facts = runtime.facts()              # read once: the served model does not change
    capabilities = ["completion"] + (["tools"] if speaks_tools(runtime.tokenizer.chat_template) else [])

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
                "template": facts.chat_template, "details": details(), "modified_at": facts.modified, "capabilities": capabilities,
                "model_info": {"general.architecture": facts.arch, f"{facts.arch}.context_length": facts.context}}

    @router.post("/chat")
    async def chat(body: ChatRequest, request: Request):
        check_model(body.model)
        refuse_unsupported(body)
        if any(m.images for m in body.messages):
            raise APIError(400, "images are not supported: the served model reads text only", param="messages")
        if not body.messages:
            return loaded(body.model, {"message": {"role": "assistant", "content": ""}})
        messages = [m.openai(i) for i, m in enumerate(body.messages)]
        tools = plan(messages, body.tools, runtime.tokenizer.chat_template)
        ids = chat_prompt_ids(runtime.tokenizer, messages, tools)
        return await respond(body, request, Answer(chat=True, prompt_ids=ids, tools=tools))

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
            turns = [ChatMessage(role="system", content=body.system)] if body.system else []
            ids = chat_prompt_ids(runtime.tokenizer, turns + [ChatMessage(role="user", content=body.prompt)], None)
        if body.context:
            try:
                check_ids(body.context, runtime.vocab_size, runtime.name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="context") from None
        return await respond(body, request, Answer(chat=False, prompt_ids=list(body.context or []) + ids))

    def refuse_unsupported(body: GenerationFields) -> None:
        if body.images:
            raise APIError(400, "images are not supported: the served model reads text only", param="images")

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
        line = {"model": body.model, "created_at": now(), **answer.whole(done.text)}
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
                    line |= {**answer.piece(event.text), "done": False}
                elif isinstance(event, DoneEvent):
                    line |= {**answer.last_piece(), **final(event, answer, started)}
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
                        "accepted_draft_tokens": s.accepted,
                        **({"tool_call_error": answer.error} if answer.error else {})}}

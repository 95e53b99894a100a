"""The path a generation takes through the server: a validated request queued on the worker, answered
as one JSON or as a stream of server-sent events in OpenAI's chunk shape.

The two generation endpoints share this path; an `Endpoint` holds what differs (the shape of a choice
and of the final answer). A streamed answer ends with `data: [DONE]`, with a `: keep-alive` comment
after each quiet interval (queued, or a long prompt being prefilled); an error after the headers are
sent is reported in-band, as OpenAI does. A client that disconnects cancels its job, which closes the
runtime's generator. This module never runs a model itself and never holds KV state.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from contextlib import aclosing, suppress
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Request

from speczoo.decoding.prompt_checks import check_fits
from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, Stats, TokenEvent
from speczoo.request import Constraint, GenerationRequest, SamplingParams
from speczoo.serve.api_errors import APIError, runtime_error
from speczoo.serve.logprobs import LogprobTrack, WireToken, chat_content, completion_logprobs
from speczoo.serve.schemas import MAX_STOP, ChatCompletion, Completion, ModelCard, Usage
from speczoo.serve.structured import constraint_of
from speczoo.serve.sse import KEEPALIVE, EventStreamResponse, sse_data
from speczoo.serve.tool_calls import Delta, ToolCallParser, finish_reason
from speczoo.serve.tool_grammar import call_constraint
from speczoo.serve.tool_prompt import MISMATCH
from speczoo.serve.tool_prompt import ToolPlan
from speczoo.serve.worker import Idle, Job, QueueFullError, Worker


@dataclass(frozen=True)
class Endpoint:
    """What differs between /v1/chat/completions and /v1/completions; the rest of the path is shared."""

    id_prefix: str       # of the response id: "chatcmpl" | "cmpl"
    chunk_object: str    # the `object` of a stream chunk
    chat: bool

    def opening(self) -> list[dict]:
        """Choices streamed before the first token (a chat stream announces the assistant's role)."""
        if self.chat:
            return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]
        return []

    def choice(self, text: str | None, finish_reason: str | None = None, tool_call_error: str | None = None,
               tokens: list[WireToken] | None = None) -> dict:
        """A streamed choice: a piece of text, or (text None) the closing one with its finish_reason;
        tokens: the log-probabilities that came with it (None: not asked for)."""
        logprobs = self.logprobs(tokens)
        if self.chat:
            delta = {} if text is None else {"content": text}
            extra = {"tool_call_error": tool_call_error} if tool_call_error else {}
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason, **extra}
        return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}

    def logprobs(self, tokens: list[WireToken] | None) -> dict | None:
        if tokens is None:
            return None
        return {"content": chat_content(tokens)} if self.chat else completion_logprobs(tokens)

    def tool_choices(self, delta: Delta, tokens: list[WireToken] | None = None) -> list[dict]:
        """The streamed choices of a piece of a tool-using answer: its content, then its finished calls
        (one choice with an empty delta when the piece shows nothing yet: a call is being written).
        The piece's log-probabilities ride on its first choice."""
        out = [self.choice(delta.content, tokens=tokens)] if delta.content else []
        if delta.calls:
            out.append({"index": 0, "delta": {"tool_calls": delta.calls}, "logprobs": None if out else
                        self.logprobs(tokens), "finish_reason": None})
        return out or [self.choice(None, tokens=tokens)]

    def tool_closing(self, parser: ToolCallParser, base_finish: str,
                     tokens: list[WireToken] | None = None) -> list[dict]:
        """The last streamed choices of a tool-using answer: what the parser held back, then the closing
        choice with the finish_reason (and why a call was not returned, if one was not)."""
        last = parser.finish()
        held = self.tool_choices(last) if last.content or last.calls else []
        return held + [self.choice(None, finish_reason(base_finish, bool(parser.calls)), parser.answer_error(),
                                   tokens=tokens)]

    def answer(self, head: dict, done: DoneEvent, usage: Usage, tools: ToolPlan | None = None,
               tokens: list[WireToken] | None = None) -> ChatCompletion | Completion:
        """The whole (non-streamed) answer; with tools, the calls read from its text."""
        common = {"id": head["id"], "created": head["created"], "model": head["model"], "usage": usage}
        logprobs = self.logprobs(tokens)
        if self.chat and tools is not None:
            read = tools.read(done.text)
            calls = [{k: v for k, v in c.items() if k != "index"} for c in read.calls]
            message = {"role": "assistant", "content": read.content, "tool_calls": calls or None}
            return ChatCompletion(**common, choices=[{
                "index": 0, "message": message, "tool_call_error": read.error, "logprobs": logprobs,
                "finish_reason": finish_reason(done.finish_reason, bool(calls))}])
        if self.chat:
            message = {"role": "assistant", "content": done.text}
            return ChatCompletion(**common, choices=[{"index": 0, "message": message, "logprobs": logprobs,
                                                      "finish_reason": done.finish_reason}])
        return Completion(**common, choices=[{"index": 0, "text": done.text, "logprobs": logprobs,
                                              "finish_reason": done.finish_reason}])


CHAT = Endpoint("chatcmpl", "chat.completion.chunk", chat=True)
TEXT = Endpoint("cmpl", "text_completion", chat=False)


@dataclass(frozen=True)
class Params:
    """The request fields an error names, in the API that was called (OpenAI's by default)."""

    max_tokens: str = "max_tokens"
    stop: str = "stop"
    speculative: str = "speculative"


OPENAI = Params()


def usage_of(stats: Stats, prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens, accepted_draft_tokens=stats.accepted,
                 draft_tokens=stats.drafted, rounds=stats.rounds, tokens_per_second=round(stats.tok_s, 3),
                 accepted_per_round=round(stats.accepted_per_round, 3), drafter=stats.drafter)


def tenant_of(request: Request, keyed: bool) -> str | None:
    """Whose earlier answers a request's suffix drafter may read (decoding/drafters/suffix_memory.py): on a
    server with --api-key, its bearer token (checked by the middleware), as a SHA-256 digest so that the
    memory never holds the key itself; without one, None: every request is the same tenant."""
    if not keyed:
        return None
    _, _, token = request.headers.get("authorization", "").partition(" ")
    return hashlib.sha256(token.strip().encode()).hexdigest()


class Generations:
    """The served runtime's generations: requests checked, queued on `worker`, answered."""

    def __init__(self, runtime, worker: Worker, default_spec: str, keepalive: float, keyed: bool = False):
        self.runtime, self.worker, self.default_spec, self.keepalive = runtime, worker, default_spec, keepalive
        self.keyed = keyed        # the server checks an API key: a request's key is its tenant (tenant_of)
        self.started = int(time.time())

    def card(self) -> ModelCard:
        rt = self.runtime
        return ModelCard(id=rt.name, created=self.started, max_seq=rt.max_seq, spec_modes=list(self.worker.spec_modes))

    def check_model(self, model: str) -> None:
        if model != self.runtime.name:
            raise APIError(404, f"the model {model!r} is not served here; this server serves "
                           f"{self.runtime.name!r} (see GET /v1/models)", "not_found_error", "model",
                           "model_not_found")

    def request(self, body, prompt_ids: list[int], max_tokens: int | None,
                tools: ToolPlan | None = None) -> GenerationRequest:
        """The OpenAI body's generation request, or the 400 that says what is wrong with it (tools: a
        chat's tool plan; a forced call is decoded inside its grammar, tool_grammar.py)."""
        try:
            logprobs = body.logprob_count()
        except ValueError as exc:
            raise APIError(400, str(exc), param="top_logprobs") from None
        sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                  seed=body.seed, presence_penalty=body.presence_penalty,
                                  frequency_penalty=body.frequency_penalty)
        return self.generation(prompt_ids, max_tokens, stop=body.stop_list(), spec=body.speculative,
                               sampling=sampling, logprobs=logprobs, constraint=self.constraint(body, tools))

    def constraint(self, body, tools: ToolPlan | None) -> Constraint | None:
        """The grammar of the answer: a forced tool call's, or the response_format's (not both: a 400)."""
        shaped = constraint_of(body.response_format)
        forced = None if tools is None else call_constraint(tools, self.runtime.tokenizer.encode)
        if shaped is not None and forced is not None:
            raise APIError(400, "response_format cannot shape an answer that tool_choice forces to be a tool call: "
                           "leave one out", param="response_format", code=MISMATCH)
        return forced or shaped

    def generation(self, prompt_ids: list[int], max_tokens: int | None, *, stop: list[str], spec: str | None,
                   sampling: SamplingParams, logprobs: int | None = None, constraint: Constraint | None = None,
                   params: Params = OPENAI) -> GenerationRequest:
        """A generation request checked against this server (any API's), or the 400 that says what is wrong.
        max_tokens None: the room left in the context; spec None: the server's --spec; constraint: a
        grammar the answer must match (structured output)."""
        rt = self.runtime
        if not prompt_ids:
            raise APIError(400, "the prompt is empty: give at least one token", param="prompt")
        if max_tokens is None:
            max_tokens = rt.max_seq - len(prompt_ids)
        try:
            check_fits(len(prompt_ids), max_tokens, rt.max_seq, new_name=params.max_tokens,
                       remedy="restart the server with a larger --max-seq")
        except CacheFullError as exc:
            raise APIError(400, str(exc), param=params.max_tokens, code="context_length_exceeded") from None
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise APIError(400, f"{params.stop} takes at most {MAX_STOP} non-empty strings", param=params.stop)
        spec = spec or self.default_spec
        if spec not in self.worker.spec_modes:
            raise APIError(400, f"{params.speculative}={spec!r} is not available on this server; it offers "
                           f"{self.worker.spec_modes} (start it with --draft NAME for 'draft')",
                           param=params.speculative)
        try:
            sampling.validate()
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc
        return GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=max_tokens, sampling=sampling,
                                 stop=stop, spec=spec, logprobs=logprobs, constraint=constraint)

    def track(self, req: GenerationRequest) -> LogprobTrack | None:
        """The log-probabilities' track of an answer that asked for them."""
        return None if req.logprobs is None else LogprobTrack(self.runtime.tokenizer.piece_bytes)

    async def respond(self, endpoint: Endpoint, body, request: Request, prompt_ids: list[int],
                      max_tokens: int | None, tools: ToolPlan | None = None):
        """Queue the generation; answer it as a stream of events or, when it is done, as one JSON
        (tools: how a chat answer's tool calls are read; None: its text is all content)."""
        req = self.request(body, prompt_ids, max_tokens, tools)
        head = {"id": f"{endpoint.id_prefix}-{uuid.uuid4().hex[:24]}", "object": endpoint.chunk_object,
                "created": int(time.time()), "model": self.runtime.name}
        job = self.submit(req, request)
        track = self.track(req)
        if body.stream:
            include = bool(body.stream_options and body.stream_options.include_usage)
            return EventStreamResponse(self._stream(job, head, endpoint, include, len(prompt_ids), tools, track))
        done = await self.collect(request, job)
        tokens = None if track is None else track.whole(done)
        return endpoint.answer(head, done, usage_of(done.stats, len(prompt_ids), len(done.ids)), tools, tokens)

    def submit(self, req: GenerationRequest, request: Request) -> Job:
        """Queue `req` on the worker as the request's tenant (tenant_of: whose earlier answers it may draft from)."""
        req.tenant = tenant_of(request, self.keyed)
        try:
            return self.worker.submit(req)
        except QueueFullError as exc:
            raise APIError(503, str(exc), "server_error", code="queue_full", headers={"Retry-After": "1"}) from exc

    async def collect(self, request: Request, job: Job) -> DoneEvent:
        """Wait for a non-streamed job to finish; cancel it if the client leaves meanwhile."""
        async def run() -> DoneEvent:
            async with aclosing(self.worker.events(job)) as events:
                async for event in events:
                    if isinstance(event, DoneEvent):
                        return event
            raise APIError(500, "the generation ended without a result", "server_error")

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        task, watch = asyncio.ensure_future(run()), asyncio.ensure_future(gone())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():          # the client left (or this handler was cancelled)
                job.cancel()
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise APIError(499, "the client closed the connection", code="client_closed")
        exc = task.exception()
        if isinstance(exc, APIError):
            raise exc
        if exc is not None:
            raise runtime_error(exc)
        return task.result()

    async def _stream(self, job: Job, head: dict, endpoint: Endpoint, include_usage: bool,
                      prompt_tokens: int, tools: ToolPlan | None, track: LogprobTrack | None) -> AsyncIterator[str]:
        def chunk(choice: dict, **extra) -> str:
            return sse_data({**head, "choices": [choice], **extra})

        def tokens(event: TokenEvent | DoneEvent) -> list[WireToken] | None:
            """The chunk's log-probabilities (None: not asked for, or no token's text is in it)."""
            return None if track is None else track.streamed(event) or None

        parser = tools.parser() if tools is not None else None
        events = self.worker.events(job, idle_after=self.keepalive)
        try:
            for choice in endpoint.opening():
                yield chunk(choice)
            async for event in events:
                if isinstance(event, Idle):
                    yield KEEPALIVE
                elif isinstance(event, TokenEvent):
                    stats = {"tokens": len(event.ids), "drafted": event.drafted, "accepted": event.accepted}
                    if parser is None:
                        yield chunk(endpoint.choice(event.text, tokens=tokens(event)), speczoo=stats)
                        continue
                    first, *rest = endpoint.tool_choices(parser.feed(event.text), tokens(event))
                    yield chunk(first, speczoo=stats)
                    for choice in rest:
                        yield chunk(choice)
                elif isinstance(event, DoneEvent):
                    closing = ([endpoint.choice(None, event.finish_reason, tokens=tokens(event))] if parser is None
                               else endpoint.tool_closing(parser, event.finish_reason, tokens(event)))
                    for choice in closing:
                        yield chunk(choice)
                    if include_usage:
                        usage = usage_of(event.stats, prompt_tokens, len(event.ids))
                        yield sse_data({**head, "choices": [], "usage": usage.model_dump()})
        except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band, as OpenAI does
            yield sse_data(runtime_error(exc).body())
        finally:
            await events.aclose()   # cancels the job if we stopped early (client gone)
        yield sse_data("[DONE]")

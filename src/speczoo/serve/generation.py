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
import time
import uuid
from contextlib import aclosing, suppress
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Request

from speczoo.decoding.prompt_checks import check_fits
from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, Stats, TokenEvent
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.serve.api_errors import APIError, runtime_error
from speczoo.serve.schemas import MAX_STOP, ChatCompletion, Completion, ModelCard, Usage
from speczoo.serve.structured import constraint_of
from speczoo.serve.sse import KEEPALIVE, EventStreamResponse, sse_data
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

    def choice(self, text: str | None, finish_reason: str | None = None) -> dict:
        """A streamed choice: a piece of text, or (text None) the closing one with its finish_reason."""
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def answer(self, head: dict, done: DoneEvent, usage: Usage) -> ChatCompletion | Completion:
        """The whole (non-streamed) answer."""
        common = {"id": head["id"], "created": head["created"], "model": head["model"], "usage": usage}
        if self.chat:
            message = {"role": "assistant", "content": done.text}
            return ChatCompletion(**common, choices=[{"index": 0, "message": message,
                                                      "finish_reason": done.finish_reason}])
        return Completion(**common, choices=[{"index": 0, "text": done.text,
                                              "finish_reason": done.finish_reason}])


CHAT = Endpoint("chatcmpl", "chat.completion.chunk", chat=True)
TEXT = Endpoint("cmpl", "text_completion", chat=False)


def usage_of(stats: Stats, prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens, accepted_draft_tokens=stats.accepted,
                 draft_tokens=stats.drafted, rounds=stats.rounds, tokens_per_second=round(stats.tok_s, 3),
                 accepted_per_round=round(stats.accepted_per_round, 3), drafter=stats.drafter)


class Generations:
    """The served runtime's generations: requests checked, queued on `worker`, answered."""

    def __init__(self, runtime, worker: Worker, default_spec: str, keepalive: float):
        self.runtime, self.worker, self.default_spec, self.keepalive = runtime, worker, default_spec, keepalive
        self.started = int(time.time())

    def card(self) -> ModelCard:
        rt = self.runtime
        return ModelCard(id=rt.name, created=self.started, max_seq=rt.max_seq, spec_modes=list(self.worker.spec_modes))

    def check_model(self, model: str) -> None:
        if model != self.runtime.name:
            raise APIError(404, f"the model {model!r} is not served here; this server serves "
                           f"{self.runtime.name!r} (see GET /v1/models)", "not_found_error", "model",
                           "model_not_found")

    def request(self, body, prompt_ids: list[int], max_tokens: int | None) -> GenerationRequest:
        """The body's generation request, or the 400 that says what is wrong with it."""
        rt = self.runtime
        if not prompt_ids:
            raise APIError(400, "the prompt is empty: give at least one token", param="prompt")
        if max_tokens is None:
            max_tokens = rt.max_seq - len(prompt_ids)
        try:
            check_fits(len(prompt_ids), max_tokens, rt.max_seq, new_name="max_tokens",
                       remedy="restart the server with a larger --max-seq")
        except CacheFullError as exc:
            raise APIError(400, str(exc), param="max_tokens", code="context_length_exceeded") from None
        stop = body.stop_list()
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise APIError(400, f"stop takes at most {MAX_STOP} non-empty strings", param="stop")
        spec = body.speculative or self.default_spec
        if spec not in self.worker.spec_modes:
            raise APIError(400, f"speculative={spec!r} is not available on this server; it offers "
                           f"{self.worker.spec_modes} (start it with --draft NAME for 'draft')",
                           param="speculative")
        sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                  seed=body.seed, presence_penalty=body.presence_penalty,
                                  frequency_penalty=body.frequency_penalty)
        try:
            sampling.validate()
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc
        return GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=max_tokens, sampling=sampling,
                                 stop=stop, spec=spec, constraint=constraint_of(body.response_format))

    async def respond(self, endpoint: Endpoint, body, request: Request, prompt_ids: list[int],
                      max_tokens: int | None):
        """Queue the generation; answer it as a stream of events or, when it is done, as one JSON."""
        req = self.request(body, prompt_ids, max_tokens)
        head = {"id": f"{endpoint.id_prefix}-{uuid.uuid4().hex[:24]}", "object": endpoint.chunk_object,
                "created": int(time.time()), "model": self.runtime.name}
        job = self._submit(req)
        if body.stream:
            include = bool(body.stream_options and body.stream_options.include_usage)
            return EventStreamResponse(self._stream(job, head, endpoint, include, len(prompt_ids)))
        done = await self._collect(request, job)
        return endpoint.answer(head, done, usage_of(done.stats, len(prompt_ids), len(done.ids)))

    def _submit(self, req: GenerationRequest) -> Job:
        try:
            return self.worker.submit(req)
        except QueueFullError as exc:
            raise APIError(503, str(exc), "server_error", code="queue_full", headers={"Retry-After": "1"}) from exc

    async def _collect(self, request: Request, job: Job) -> DoneEvent:
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
                      prompt_tokens: int) -> AsyncIterator[str]:
        def chunk(choice: dict, **extra) -> str:
            return sse_data({**head, "choices": [choice], **extra})

        events = self.worker.events(job, idle_after=self.keepalive)
        try:
            for choice in endpoint.opening():
                yield chunk(choice)
            async for event in events:
                if isinstance(event, Idle):
                    yield KEEPALIVE
                elif isinstance(event, TokenEvent):
                    yield chunk(endpoint.choice(event.text), speczoo={
                        "tokens": len(event.ids), "drafted": event.drafted, "accepted": event.accepted})
                elif isinstance(event, DoneEvent):
                    yield chunk(endpoint.choice(None, event.finish_reason))
                    if include_usage:
                        usage = usage_of(event.stats, prompt_tokens, len(event.ids))
                        yield sse_data({**head, "choices": [], "usage": usage.model_dump()})
        except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band, as OpenAI does
            yield sse_data(runtime_error(exc).body())
        finally:
            await events.aclose()   # cancels the job if we stopped early (client gone)
        yield sse_data("[DONE]")

"""The OpenAI-compatible HTTP app: /v1/models, /v1/chat/completions, /v1/completions, and the chat page.

`create_app(runtime, ...)` wraps one loaded runtime. Requests are validated here (400/401/404 in
OpenAI's error shape, before anything is queued), mapped to a `GenerationRequest`, and queued on the
single `Worker` thread that owns the runtime. Answers stream as server-sent events in OpenAI's chunk
shape, ending with `data: [DONE]`, with a `: keep-alive` comment after each quiet interval (queued, or
a long prompt being prefilled). A client that disconnects cancels its job, which closes the runtime's
generator. The two generation endpoints share one path; an `Endpoint` holds what differs (the shape of
a choice and of the final answer). This module never runs a model itself and never holds KV state.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from speczoo.chat import render_chat_prompt
from speczoo.decoding.prompt_checks import check_fits, check_ids
from speczoo.errors import CacheFullError, SpeczooError
from speczoo.events import DoneEvent, GenerationRequest, SamplingParams, Stats, TokenEvent
from speczoo.serve.schemas import (
    MAX_STOP, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion,
    CompletionChunk, CompletionRequest, ErrorResponse, Health, ModelCard, ModelList, Usage,
)
from speczoo.serve.sse import KEEPALIVE, EventStreamResponse, sse_data
from speczoo.serve.worker import Idle, Job, QueueFullError, Worker

STATIC = Path(__file__).parent / "static"


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer", **self.headers} if self.status == 401 else self.headers
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _runtime_error(exc: BaseException) -> APIError:
    """Map what the runtime raised to an API error: user errors 400, anything else 500."""
    if isinstance(exc, (SpeczooError, ValueError)):
        return APIError(400, str(exc))
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")


ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "Malformed JSON or invalid parameters"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (when the server has one)"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
}


def stream_doc(chunk: type) -> dict:
    """Responses of a streaming-capable route: JSON, or server-sent events whose `data` is a chunk,
    an in-band error, or the final "[DONE]" (OpenAPI 3.1: `schema` describes one event)."""
    event = {"type": "object", "required": ["data"], "properties": {"data": {"oneOf": [
        {"const": "[DONE]"},
        {"type": "string", "not": {"const": "[DONE]"}, "contentMediaType": "application/json",
         "contentSchema": {"anyOf": [{"$ref": f"#/components/schemas/{chunk.__name__}"},
                                     {"$ref": "#/components/schemas/ErrorResponse"}]}}]}}}
    return {200: {"content": {"text/event-stream": {"schema": event}},
                  "description": "JSON when stream=false; server-sent events when stream=true"},
            503: {"model": ErrorResponse, "description": "Too many queued requests"}}


# -- authentication (an ASGI middleware, so a wrong key is 401 before the body is even parsed) ----
class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.key):
                err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                               "with the key given to `speczoo serve --api-key`",
                               "authentication_error", code="invalid_api_key")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


def create_app(runtime, *, api_key: str | None = None, default_spec: str = "auto",
               max_queue: int = 64, worker: Worker | None = None, keepalive: float = 5.0) -> FastAPI:
    """The app serving `runtime` (a loaded `speczoo.runtime.Runtime` or anything with its contract).
    keepalive: seconds without an event after which a stream gets a `: keep-alive` comment."""
    if keepalive <= 0:
        raise ValueError(f"keepalive must be > 0 seconds, got {keepalive}")
    if default_spec not in runtime.spec_modes:
        raise ValueError(f"default spec mode {default_spec!r} is not offered by this runtime; "
                         f"use one of {runtime.spec_modes}")
    worker = worker or Worker(runtime, max_queue=max_queue)
    started = int(time.time())
    bearer = HTTPBearer(auto_error=False, description="The key given to `speczoo serve --api-key`")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="speczoo", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible server for lossless speculative decoding on the CPU.")
    app.state.worker = worker
    app.state.runtime = runtime
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    # Documents the bearer scheme in the OpenAPI schema; the middleware does the checking.
    auth = [Depends(bearer)] if api_key else []

    # -- error shapes ----------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            msg = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip()
            loc = []
        elif tuple(first.get("loc", ())) == ("body",):
            msg = ("the request body must be a JSON object (send it with Content-Type: "
                   "application/json)")
        else:
            msg = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: "
                            f"{e.get('msg', 'invalid')}" for e in errors[:5])
        return APIError(400, msg or "invalid request", param=".".join(loc) or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type_, headers=exc.headers).response()

    # -- helpers ---------------------------------------------------------------------------
    def card() -> ModelCard:
        return ModelCard(id=runtime.name, created=started, max_seq=runtime.max_seq,
                         spec_modes=list(runtime.spec_modes))

    def check_model(model: str) -> None:
        if model != runtime.name:
            raise APIError(404, f"the model {model!r} is not served here; this server serves "
                           f"{runtime.name!r} (see GET /v1/models)", "not_found_error", "model",
                           "model_not_found")

    def generation_request(body, prompt_ids: list[int], max_tokens: int | None) -> GenerationRequest:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty: give at least one token", param="prompt")
        if max_tokens is None:
            max_tokens = runtime.max_seq - len(prompt_ids)
        try:
            check_fits(len(prompt_ids), max_tokens, runtime.max_seq, new_name="max_tokens",
                       remedy="restart the server with a larger --max-seq")
        except CacheFullError as exc:
            raise APIError(400, str(exc), param="max_tokens", code="context_length_exceeded") from None
        stop = body.stop_list()
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise APIError(400, f"stop takes at most {MAX_STOP} non-empty strings", param="stop")
        spec = body.speculative or default_spec
        if spec not in runtime.spec_modes:
            raise APIError(400, f"speculative={spec!r} is not available on this server; it offers "
                           f"{runtime.spec_modes} (start it with --draft NAME for 'draft')",
                           param="speculative")
        sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                  seed=body.seed)
        try:
            sampling.validate()
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc
        return GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=max_tokens, sampling=sampling,
                                 stop=stop, spec=spec)

    def submit(req: GenerationRequest) -> Job:
        try:
            return worker.submit(req)
        except QueueFullError as exc:
            raise APIError(503, str(exc), "server_error", code="queue_full") from exc

    async def collect(request: Request, job: Job) -> DoneEvent:
        """Wait for a non-streamed job to finish; cancel it if the client leaves meanwhile."""
        async def run() -> DoneEvent:
            async with aclosing(worker.events(job)) as events:
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
            raise _runtime_error(exc)
        return task.result()

    async def stream(job: Job, head: dict, endpoint: Endpoint, include_usage: bool,
                     prompt_tokens: int) -> AsyncIterator[str]:
        def chunk(choice: dict, **extra) -> str:
            return sse_data({**head, "choices": [choice], **extra})

        events = worker.events(job, idle_after=keepalive)
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
            yield sse_data(_runtime_error(exc).body())
        finally:
            await events.aclose()   # cancels the job if we stopped early (client gone)
        yield sse_data("[DONE]")

    async def respond(endpoint: Endpoint, body, request: Request, prompt_ids: list[int],
                      max_tokens: int | None):
        """Queue the generation; answer it as a stream of events or, when it is done, as one JSON."""
        req = generation_request(body, prompt_ids, max_tokens)
        head = {"id": f"{endpoint.id_prefix}-{uuid.uuid4().hex[:24]}", "object": endpoint.chunk_object,
                "created": int(time.time()), "model": runtime.name}
        job = submit(req)
        if body.stream:
            include = bool(body.stream_options and body.stream_options.include_usage)
            return EventStreamResponse(stream(job, head, endpoint, include, len(prompt_ids)))
        done = await collect(request, job)
        return endpoint.answer(head, done, usage_of(done.stats, len(prompt_ids), len(done.ids)))

    # -- routes ----------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/health", response_model=Health, summary="Liveness and queue depth")
    async def health() -> Health:
        return Health(model=runtime.name, busy=worker.busy, queued=worker.queued, served=worker.served,
                      cancelled=worker.cancelled)

    @app.get("/v1/models", response_model=ModelList, dependencies=auth,
             responses={401: ERROR_RESPONSES[401]}, summary="The model this server serves")
    async def models() -> ModelList:
        return ModelList(data=[card()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard, dependencies=auth,
             responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404]})
    async def model(model_id: str) -> ModelCard:
        check_model(model_id)
        return card()

    @app.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=auth,
              responses={**ERROR_RESPONSES, **stream_doc(ChatCompletionChunk)},
              summary="Chat completion (stream or not)")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt_ids = runtime.tokenizer.encode(render_chat_prompt(runtime.tokenizer, messages))
        except (ValueError, SpeczooError) as exc:   # e.g. a template that rejects the role order
            raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from exc
        return await respond(CHAT, body, request, prompt_ids, body.max_completion_tokens or body.max_tokens)

    @app.post("/v1/completions", response_model=Completion, dependencies=auth,
              responses={**ERROR_RESPONSES, **stream_doc(CompletionChunk)},
              summary="Text completion (stream or not)")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        if isinstance(body.prompt, str):
            prompt_ids = runtime.tokenizer.encode(body.prompt)
        else:
            prompt_ids = list(body.prompt)
            try:
                check_ids(prompt_ids, runtime.vocab_size, runtime.name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="prompt") from None
        return await respond(TEXT, body, request, prompt_ids, body.max_tokens)

    _publish_accurate_schema(app, list(runtime.spec_modes), runtime.vocab_size)
    return app


def _publish_accurate_schema(app: FastAPI, spec_modes: list[str], vocab_size: int) -> None:
    """Fix what FastAPI cannot know: validation errors are 400 here (OpenAI's way), not 422,
    `speculative` takes only the modes this runtime offers (e.g. no "draft" without --draft), and
    a prompt's token ids are below the model's vocabulary size."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        for path in schema.get("paths", {}).values():
            for op in path.values():
                responses = op.get("responses", {})
                if "422" in responses:
                    del responses["422"]
                    responses.setdefault("400", {
                        "description": "Invalid parameters",
                        "content": {"application/json": {
                            "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            for option in components[name]["properties"]["speculative"]["anyOf"]:
                if "enum" in option:
                    option["enum"] = [m for m in option["enum"] if m in spec_modes]
        for option in components["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
            if option.get("type") == "array":
                option["items"]["maximum"] = vocab_size - 1
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for model in (ChatCompletionChunk, CompletionChunk):   # referenced by the event-stream docs
            sub = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, definition in sub.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components[model.__name__] = sub
        app.openapi_schema = schema
        return schema

    app.openapi = openapi

"""The OpenAI-compatible HTTP app: /v1/models, /v1/chat/completions, /v1/completions, and the chat page;
Ollama's API beside it under /api/ (ollama.py).

`create_app(runtime, ...)` wraps one loaded runtime and assembles the parts: errors in OpenAI's shape
(api_errors.py), the API key check, the routes (here, one small function per concern), the path a
generation takes to the single `Worker` thread that owns the runtime (generation.py) and the published
schema (openapi.py). Requests are validated before anything is queued (400/401/404). This module never
runs a model itself and never holds KV state.
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles

from speczoo.decoding.prompt_checks import check_ids
from speczoo.serve.api_errors import APIError, install_error_handlers, is_ollama
from speczoo.serve.generation import CHAT, TEXT, Generations
from speczoo.serve.metrics import Metrics
from speczoo.serve.ollama import ollama_routes
from speczoo.serve.openapi import ERROR_RESPONSES, publish_accurate_schema, stream_doc
from speczoo.serve.schemas import (
    ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionChunk,
    CompletionRequest, Health, ModelCard, ModelList,
)
from speczoo.serve.tool_prompt import chat_prompt_ids, plan_tools
from speczoo.serve.worker import Worker

STATIC = Path(__file__).parent / "static"


# -- authentication (an ASGI middleware, so a wrong key is 401 before the body is even parsed) ----
class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or is_ollama(scope["path"])):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.key):
                err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                               "with the key given to `speczoo serve --api-key`",
                               "authentication_error", code="invalid_api_key")
                await err.response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)



def create_app(runtime, *, api_key: str | None = None, default_spec: str = "auto",
               max_queue: int = 64, worker: Worker | None = None, keepalive: float = 5.0) -> FastAPI:
    """The app serving `runtime` (a loaded `speczoo.runtime.Runtime` or anything with its contract).
    keepalive: seconds without an event after which a stream gets a `: keep-alive` comment."""
    if keepalive <= 0:
        raise ValueError(f"keepalive must be > 0 seconds, got {keepalive}")
    worker = worker or Worker(runtime, max_queue=max_queue)
    if default_spec not in worker.spec_modes:
        raise ValueError(f"default spec mode {default_spec!r} is not offered by this runtime; "
                         f"use one of {worker.spec_modes}")
    gens = Generations(runtime, worker, default_spec, keepalive, keyed=bool(api_key))
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
    Metrics(worker).add_route(app)                 # GET /metrics (Prometheus)
    app.state.runtime = runtime
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    # Documents the bearer scheme in the OpenAPI schema; the middleware does the checking.
    auth = [Depends(bearer)] if api_key else []
    install_error_handlers(app)
    _page_routes(app, gens)
    _model_routes(app, gens, auth)
    _generation_routes(app, gens, auth)
    app.include_router(ollama_routes(gens))
    publish_accurate_schema(app, list(worker.spec_modes), runtime.vocab_size)
    return app


def _page_routes(app: FastAPI, gens: Generations) -> None:
    """The web chat page, its static files, and /health."""
    worker = gens.worker

    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/health", response_model=Health, summary="Liveness and queue depth")
    async def health() -> Health:
        return Health(model=gens.runtime.name, busy=worker.busy, running=worker.running, queued=worker.queued,
                      served=worker.served, cancelled=worker.cancelled)


def _model_routes(app: FastAPI, gens: Generations, auth: list) -> None:
    """/v1/models and /v1/models/{model_id}: the one model this server serves."""

    @app.get("/v1/models", response_model=ModelList, dependencies=auth,
             responses={401: ERROR_RESPONSES[401]}, summary="The model this server serves")
    async def models() -> ModelList:
        return ModelList(data=[gens.card()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard, dependencies=auth,
             responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404]})
    async def model(model_id: str) -> ModelCard:
        gens.check_model(model_id)
        return gens.card()


def _generation_routes(app: FastAPI, gens: Generations, auth: list) -> None:
    """/v1/chat/completions and /v1/completions: the prompt's ids, then the shared generation path."""
    runtime = gens.runtime

    @app.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=auth,
              responses={**ERROR_RESPONSES, **stream_doc(ChatCompletionChunk)},
              summary="Chat completion (stream or not)")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        gens.check_model(body.model)
        tools = plan_tools(body, runtime.tokenizer.chat_template)
        prompt_ids = chat_prompt_ids(runtime.tokenizer, body.messages, tools)
        return await gens.respond(CHAT, body, request, prompt_ids, body.max_completion_tokens or body.max_tokens,
                                  tools)

    @app.post("/v1/completions", response_model=Completion, dependencies=auth,
              responses={**ERROR_RESPONSES, **stream_doc(CompletionChunk)},
              summary="Text completion (stream or not)")
    async def completions(body: CompletionRequest, request: Request):
        gens.check_model(body.model)
        if isinstance(body.prompt, str):
            prompt_ids = runtime.tokenizer.encode(body.prompt)
        else:
            prompt_ids = list(body.prompt)
            try:
                check_ids(prompt_ids, runtime.vocab_size, runtime.name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="prompt") from None
        return await gens.respond(TEXT, body, request, prompt_ids, body.max_tokens)

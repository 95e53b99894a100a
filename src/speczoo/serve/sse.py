"""Server-sent events: the framing, keep-alive comments while nothing is ready, and the streaming
response that cancels its body when the client leaves.

The app builds its chunks (dicts) and hands them here to be framed as `data: ...` events. While a
request waits in the queue or its long prompt is being prefilled, no event comes for seconds, and
proxies and clients time out an idle connection; the app then sends `KEEPALIVE`, an SSE comment that
every SSE parser ignores. This module never builds OpenAI's chunk shapes and never touches the worker
or a model.
"""

from __future__ import annotations

import json

import anyio
from fastapi.responses import StreamingResponse

KEEPALIVE = ": keep-alive\n\n"   # an SSE comment line: keeps the connection busy, carries no event


def sse_data(obj: dict | str) -> str:
    """One event whose data is `obj` (a dict as compact JSON, a string as is)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n"


class EventStreamResponse(StreamingResponse):
    """Streams the body while listening for the client leaving; then closes the body iterator,
    whose `finally` cancels the job (whatever ASGI spec version the server speaks)."""

    media_type = "text/event-stream"

    def __init__(self, content, **kw):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(kw.pop("headers", None) or {})}
        super().__init__(content, headers=headers, **kw)

    async def __call__(self, scope, receive, send):
        async def stream() -> None:
            try:
                await self.stream_response(send)
            except OSError:          # the client went away while we were sending
                pass
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()

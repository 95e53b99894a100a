"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, for every way a request fails;
under /api/ (Ollama's API, serve/ollama.py) in Ollama's: {"error": "message"}, with the same status.

`APIError` is what the routes raise; `install_error_handlers` makes FastAPI answer its own failures
(a body that is not JSON, a field out of range: 400 here, as OpenAI answers, not FastAPI's 422; an
unknown path) in the same shape, and `runtime_error` maps what the runtime raised. This module never
touches the runtime or the worker.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from speczoo.errors import SpeczooError


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

    def response(self, path: str = "") -> JSONResponse:
        """The reply; `path`: the request's, whose API picks the shape (Ollama's under /api/)."""
        headers = {"WWW-Authenticate": "Bearer", **self.headers} if self.status == 401 else self.headers
        body = {"error": self.message} if is_ollama(path) else self.body()
        return JSONResponse(body, status_code=self.status, headers=headers)


def is_ollama(path: str) -> bool:
    """Whether a request's path is Ollama's API."""
    return path.startswith("/api/")


def runtime_error(exc: BaseException) -> APIError:
    """Map what the runtime raised to an API error: user errors 400, anything else 500."""
    if isinstance(exc, (SpeczooError, ValueError)):
        return APIError(400, str(exc))
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")


def validation_error(errors: list[dict]) -> APIError:
    """The 400 for a request FastAPI could not validate: which field, and why (the first five)."""
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
    return APIError(400, msg or "invalid request", param=".".join(loc) or None)


def install_error_handlers(app: FastAPI) -> None:
    """Answer APIError, FastAPI's validation errors and Starlette's HTTP errors in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc.errors()).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type_, headers=exc.headers).response(request.url.path)

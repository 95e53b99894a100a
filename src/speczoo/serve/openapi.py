"""The published OpenAPI schema: the error responses of each route, the event-stream documentation, and
the fixes that make the schema say exactly what this server accepts.

FastAPI derives most of the schema from the pydantic models (schemas.py); what it cannot know is added
here: validation errors are 400 (OpenAI's way), not 422; `speculative` takes only the modes the loaded
runtime offers; a prompt's token ids are below the model's vocabulary size; a streamed answer is
server-sent events whose data are chunks. This module never handles a request.
"""

from __future__ import annotations

from fastapi import FastAPI

from speczoo.serve.schemas import ChatCompletionChunk, CompletionChunk, ErrorResponse

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


def publish_accurate_schema(app: FastAPI, spec_modes: list[str], vocab_size: int) -> None:
    """Fix what FastAPI cannot know: validation errors are 400 here (OpenAI's way), not 422,
    `speculative` takes only the modes this runtime offers (e.g. no "draft" without --draft), and
    a prompt's token ids are below the model's vocabulary size."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        _errors_are_400(schema)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _offered_values(components, spec_modes, vocab_size)
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


def _errors_are_400(schema: dict) -> None:
    """Every route's 422 becomes the 400 this server answers, in OpenAI's error shape."""
    for path in schema.get("paths", {}).values():
        for op in path.values():
            responses = op.get("responses", {})
            if "422" in responses:
                del responses["422"]
                responses.setdefault("400", {
                    "description": "Invalid parameters",
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})


def _offered_values(components: dict, spec_modes: list[str], vocab_size: int) -> None:
    """`speculative` lists only the offered modes; a prompt's ids stop at the vocabulary's last."""
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        for option in components[name]["properties"]["speculative"]["anyOf"]:
            if "enum" in option:
                option["enum"] = [m for m in option["enum"] if m in spec_modes]
    for option in components["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
        if option.get("type") == "array":
            option["items"]["maximum"] = vocab_size - 1

"""OpenAI's `response_format` and Ollama's `format` as a generation's grammar constraint (request.py `Constraint`).

`text` (or none) leaves the answer free; `json_object` constrains it to any JSON object; `json_schema`
to its schema, compiled by llguidance (speczoo/grammar.py) now, so that a schema it cannot honour is a
400 with llguidance's message before anything is queued. This module never parses the model's output
and never touches a model.
"""

from __future__ import annotations

import json

from speczoo.grammar import JSON_OBJECT, check
from speczoo.request import Constraint
from speczoo.serve.api_errors import APIError
from speczoo.serve.schemas import JsonObjectFormat, JsonSchemaFormat, ResponseFormat

INVALID_SCHEMA = "invalid_json_schema"     # the error code of a schema llguidance refuses


def constraint_of(response_format: ResponseFormat | None) -> Constraint | None:
    """The constraint a request's response_format asks for (None: free text), or the 400 that says why
    its schema cannot be used."""
    if isinstance(response_format, JsonObjectFormat):
        return Constraint("json_schema", JSON_OBJECT)
    if not isinstance(response_format, JsonSchemaFormat):
        return None
    return schema_constraint(response_format.json_schema.schema_, "response_format")


def schema_constraint(schema: dict | None, param: str) -> Constraint:
    """A JSON schema's constraint (None: any JSON), compiled now: a schema llguidance cannot honour is a
    400 that names `param`, the request field it came in."""
    constraint = Constraint("json_schema", json.dumps({} if schema is None else schema))
    try:
        check(constraint)
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code=INVALID_SCHEMA) from None
    return constraint


def ollama_format(fmt: str | dict | None) -> Constraint | None:
    """Ollama's `format`: "json" (any JSON object), a JSON schema, or nothing ("" / None: free text)."""
    if not fmt:
        return None
    if fmt == "json":
        return Constraint("json_schema", JSON_OBJECT)
    return schema_constraint(fmt, "format")

"""OpenAI's `response_format` as a generation's grammar constraint (request.py `Constraint`).

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
    schema = response_format.json_schema.schema_
    constraint = Constraint("json_schema", json.dumps({} if schema is None else schema))
    try:
        check(constraint)
    except ValueError as exc:
        raise APIError(400, str(exc), param="response_format", code=INVALID_SCHEMA) from None
    return constraint

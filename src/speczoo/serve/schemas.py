"""The wire format of the OpenAI-compatible API: request and response models (pydantic).

These models are the published OpenAPI schema, so they must describe exactly what the server accepts
and returns. Shapes follow OpenAI's chat/completions and completions APIs; speczoo's additions are the
request field `speculative` (and `top_k`; `response_format` is OpenAI's, on completions too), the usage fields `accepted_draft_tokens`, `draft_tokens`,
`rounds`, `tokens_per_second`, `drafter`, and the per-chunk `speczoo` round stats of a stream.
Unknown request fields are ignored (clients send many optional ones); fields the server cannot honour
are rejected with a 400 instead of silently ignored. This module never touches a model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from speczoo.decoding.modes import MODES

SpecModeName = Literal[MODES]      # the bare modes; a request names no draft model or head
MAX_STOP = 4


def _json_number(value: object) -> object:
    """JSON numbers only: no booleans and no numeric strings (pydantic's lax mode would take both)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


def _json_bool(value: object) -> object:
    if not isinstance(value, bool):
        raise ValueError(f"expected a boolean, got {type(value).__name__}")
    return value


# Schema-exact scalars: an integer accepts 3 and 3.0 (JSON Schema's integer) but not true or "3".
# Constraints go before the validator inside Annotated, or pydantic publishes them as raw "ge"/"le".
NUM = BeforeValidator(_json_number)
Int = Annotated[int, NUM]
Float = Annotated[float, BeforeValidator(_json_number)]
Bool = Annotated[bool, Strict()]
StopText = Annotated[str, Field(min_length=1)]
PromptText = Annotated[str, Field(min_length=1)]
PromptIds = Annotated[list[Annotated[int, Field(ge=0), NUM]], Field(min_length=1)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- requests --------------------------------------------------------------------------------------
class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Request):
    include_usage: Bool = False


class JsonSchemaSpec(_Request):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="A JSON Schema the answer must match (absent: any JSON value).")
    strict: Bool | None = Field(None, description="The answer always matches the schema (constrained decoding), "
                                "whatever this says.")


class TextFormat(_Request):
    type: Literal["text"]


class JsonObjectFormat(_Request):
    type: Literal["json_object"]


class JsonSchemaFormat(_Request):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class _SamplingFields(_Request):
    model: str = Field(description="Model id, as listed by GET /v1/models.")
    max_tokens: Annotated[int, Field(ge=1), NUM] | None = Field(
        None, description="Tokens to generate at most; default: the room left in the context.")
    temperature: Float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy (the default).")
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(0, ge=0, description="speczoo extension; 0 = off.")
    seed: Annotated[int, Field(ge=0, le=2**53 - 1), NUM] | None = Field(
        None, description="Up to 2**53-1 (exact in JSON).")
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"A stop string or up to {MAX_STOP}; the answer ends before the first one.")
    stream: Bool = False
    stream_options: StreamOptions | None = None
    n: Int = Field(1, ge=1, le=1, description="Only 1 choice is supported.")
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0, description="Subtracted from the logit of every "
                                    "token the answer has used so far.")
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0, description="Times the count of each token in the "
                                     "answer so far, subtracted from its logit.")
    response_format: ResponseFormat | None = Field(
        None, description="text (the default), json_object (any JSON object) or json_schema: the answer is "
        "decoded inside the grammar of the schema (llguidance), with speculation as requested.")
    speculative: SpecModeName | None = Field(
        None, description="speczoo extension: speculative decoding mode; default: the server's --spec. "
        "Greedy output is identical in every mode (lossless); only the speed changes.")

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1), NUM] | None = Field(
        None, description="Alias of max_tokens.")


class CompletionRequest(_SamplingFields):
    prompt: PromptText | PromptIds = Field(
        description="A non-empty string, or a non-empty list of token ids.")
    echo: Annotated[Literal[False], BeforeValidator(_json_bool)] = Field(
        False, description="Not supported: must be false.")


# -- responses -------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    rounds: int = 0
    tokens_per_second: float = 0.0
    accepted_per_round: float = 0.0
    drafter: str = "off"


class RoundStats(BaseModel):
    """speczoo extension on stream chunks: what this chunk's round did."""

    tokens: int
    drafted: int
    accepted: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speczoo: RoundStats | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed completion (OpenAI reuses the object name)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speczoo: RoundStats | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "speczoo"
    max_seq: int
    spec_modes: list[str]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    busy: bool
    running: int = Field(description="requests generating right now: they share the model (batched with --parallel)")
    queued: int
    served: int
    cancelled: int

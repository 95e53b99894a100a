"""The wire format of the OpenAI-compatible API: request and response models (pydantic).

These models are the published OpenAPI schema, so they must describe exactly what the server accepts
and returns. Shapes follow OpenAI's chat/completions and completions APIs; speczoo's additions are the
request field `speculative` (and `top_k`; `response_format` is OpenAI's, on completions too), the usage
fields `accepted_draft_tokens`, `draft_tokens`, `rounds`, `tokens_per_second`, `drafter`, the per-chunk
`speczoo` round stats of a stream, and a choice's `tool_call_error` (why tool-call text was not returned
as a call).
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


FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionCallIn(_Request):
    name: str
    arguments: str = Field(description="The call's arguments: a JSON object, as a string.")


class ToolCallIn(_Request):
    """A call an earlier assistant turn made (sent back in the conversation)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="assistant turns: the calls it made")
    tool_call_id: str | None = Field(None, description="tool turns: the call this is the result of")
    name: str | None = None

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


class FunctionDef(_Request):
    name: FunctionName
    description: str | None = None
    parameters: dict | None = Field(None, description="JSON Schema of the arguments (an object).")
    strict: Bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    # top_logprobs (when not null) needs logprobs: true: said in the schema, so that it is exactly what is accepted
    model_config = ConfigDict(extra="ignore", json_schema_extra={"dependentSchemas": {"top_logprobs": {"anyOf": [
        {"properties": {"top_logprobs": {"type": "null"}}},
        {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}]}}})

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = Field(
        None, description="Functions the model may call, rendered through the model's own chat template; "
        "a model whose template defines no tools answers 400.")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="auto (the default with tools), none (tools are not shown to the model), "
        "required or a named function (the call is decoded inside a grammar: its arguments match the function's "
        "parameters schema).")
    parallel_tool_calls: Bool = Field(True, description="false: only the answer's first call is returned.")
    max_completion_tokens: Annotated[int, Field(ge=1), NUM] | None = Field(
        None, description="Alias of max_tokens.")
    logprobs: Bool = Field(False, description="Return each output token's log-probability (the model's raw "
                           "distribution, before temperature, top-k and top-p).")
    top_logprobs: Annotated[int, Field(ge=0, le=20), NUM] | None = Field(
        None, description="With logprobs: the most likely tokens to list at each position, 0..20.")

    def logprob_count(self) -> int | None:
        """The alternatives per token to compute (None: no log-probabilities)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingFields):
    prompt: PromptText | PromptIds = Field(
        description="A non-empty string, or a non-empty list of token ids.")
    echo: Annotated[Literal[False], BeforeValidator(_json_bool)] = Field(
        False, description="Not supported: must be false.")
    logprobs: Annotated[int, Field(ge=0, le=5), NUM] | None = Field(
        None, description="Return each output token's log-probability (the model's raw distribution) and "
        "the N most likely tokens at each position, 0..5.")

    def logprob_count(self) -> int | None:
        return self.logprobs


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


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TopLogprob(BaseModel):
    token: str = Field(description="The token's text; a piece of a UTF-8 character as `bytes:\\xNN...`.")
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(description="Characters from the start of the completion.")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


def _tool_call_error():
    return Field(None, description="speczoo extension: why tool-call text the model wrote was not returned "
                 "as a call (its raw text is in content).")


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None
    tool_call_error: str | None = _tool_call_error()


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    """A streamed call: speczoo sends each call whole, in one delta, once the model has finished it."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    tool_call_error: str | None = _tool_call_error()


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
    logprobs: CompletionLogprobs | None = None


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

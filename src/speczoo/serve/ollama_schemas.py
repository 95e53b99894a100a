"""The wire format of Ollama's API (/api/chat, /api/generate, /api/show): the request models (pydantic).

Field names and defaults are Ollama's (`stream` defaults to true; sampling lives in `options`, with
`num_predict` for the token budget), except that `options.temperature` defaults to 0 (greedy, as
speczoo's OpenAI API does) where Ollama's default is 0.8. speczoo's extension is `options.speculative`.
Unknown fields and the options that only tune Ollama's own loading (num_ctx, num_gpu, num_thread, ...)
are accepted and ignored; an option that would change the answer and that speczoo cannot honour
(repeat_penalty, mirostat, ...) is refused with a 400, never silently dropped. Tools are OpenAI's function
objects; an assistant turn's calls carry their arguments as an object, and `Message.openai` turns a
turn into the OpenAI route's model so that both APIs render tools one way. Responses are built as
plain dicts by serve/ollama.py. This module never touches a model.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speczoo.serve.schemas import (
    NUM, Bool, ChatMessage, Float, FunctionCallIn, Int, SpecModeName, StopText, Tool, ToolCallIn,
)

# options that change the answer, with the value under which they do nothing
NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0,
           "typical_p": 1.0, "tfs_z": 1.0, "min_p": 0.0}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Request):
    temperature: Float = Field(0.0, ge=0.0, le=100.0, description="0 = greedy (speczoo's default; Ollama's is 0.8).")
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(0, ge=0, description="0 = off.")
    seed: Annotated[int, Field(ge=0, le=2**63 - 1), NUM] | None = None
    num_predict: Annotated[int, Field(ge=-2), NUM] | None = Field(
        None, description="Tokens to generate at most; -1 or -2 (or none): until the context is full.")
    stop: StopText | list[StopText] | None = None
    speculative: SpecModeName | None = Field(
        None, description="speczoo extension: the speculative mode; default: the server's --spec. Greedy output "
        "is identical in every mode (lossless); only the speed changes.")
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _refuse_what_changes_the_answer(self) -> Options:
        for name, value in (self.model_extra or {}).items():
            if name in NEUTRAL and value is not None and value != NEUTRAL[name]:
                raise ValueError(f"{name}={value!r} is not supported (speczoo samples the model's own "
                                 f"distribution): leave it out or set {NEUTRAL[name]}")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def max_tokens(self) -> int | None:
        return None if self.num_predict is None or self.num_predict < 0 else self.num_predict


Format = Literal["", "json"] | dict[str, Any] | None


class GenerationFields(_Request):
    model: str = Field(min_length=1, description="The model, as GET /api/tags lists it (a `:latest` tag is accepted).")
    stream: Bool = True
    options: Options = Field(default_factory=Options)
    format: Format = Field(None, description='"json" (any JSON object) or a JSON schema: the answer is decoded inside its grammar.')
    think: Bool | Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted; a reasoning model's thinking stays in the answer's text.")
    keep_alive: float | str | None = Field(None, description="Accepted; the served model stays loaded.")
    logprobs: Bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20), NUM] | None = None
    images: list[str] | None = None

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class CallFunction(_Request):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict, description="An object (Ollama's shape); a JSON "
                                            "string is taken too.")

    def arguments_text(self) -> str:
        """The arguments as OpenAI's wire has them: a JSON string."""
        args = self.arguments
        return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class ToolCall(_Request):
    """A call an earlier assistant turn made, as Ollama sends it back: arguments are an object."""

    function: CallFunction
    id: str | None = None


class OllamaTool(Tool):
    type: Literal["function"] = "function"


class Message(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = Field(None, description="tool turns: the function whose result this is.")
    tool_call_id: str | None = None
    thinking: str | None = None

    def openai(self, index: int) -> ChatMessage:
        """This message as the OpenAI route's model (its tools are rendered the same way); index: its
        place in the conversation, to name the calls that came without an id."""
        calls = [ToolCallIn(id=c.id or f"call_{index}_{i}",
                            function=FunctionCallIn(name=c.function.name, arguments=c.function.arguments_text()))
                 for i, c in enumerate(self.tool_calls or [])]
        return ChatMessage(role=self.role, content=self.content, tool_calls=calls or None,
                           tool_call_id=self.tool_call_id, name=self.tool_name)


class ChatRequest(GenerationFields):
    messages: list[Message] = Field(default_factory=list, description="Empty: only loads the model.")
    tools: list[OllamaTool] | None = Field(None, description="Functions the model may call (OpenAI's function "
                                           "objects), rendered through the model's own chat template.")


class GenerateRequest(GenerationFields):
    prompt: str | None = Field(None, description="Empty: only loads the model.")
    system: str | None = None
    raw: Bool = False
    context: list[Annotated[int, Field(ge=0), NUM]] | None = Field(
        None, description="The `context` of an earlier answer: the conversation goes on from it.")
    suffix: str | None = None
    template: str | None = None


class ShowRequest(_Request):
    model: str | None = None
    name: str | None = Field(None, description="The older name of `model`.")

"""A tool-using chat for the server tests (test_serve_tools.py, test_serve_ollama_tools.py): the fake
runtime's Hermes-style template, one weather tool, the question and the call a model answers it with; a server over it.
Imported by test files, never a test itself."""

from __future__ import annotations

from contextlib import contextmanager

from fake_runtime import FakeRuntime
from openai_chat import KEY
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker

HERMES_TEMPLATE = "{% if tools %}<tool_call>{% endif %}"   # all the fake needs: the format's marker
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@contextmanager
def fake_tool_server(workers: int):
    """(runtime, server): a real server with API key KEY over the fake runtime, its template speaking
    Hermes tool calls, answering one byte a round (spec "off"), `workers` requests at a time."""
    rt = FakeRuntime(spec_modes=["off", "ngram"])
    rt.tokenizer.chat_template = HERMES_TEMPLATE
    worker = BatchWorker(rt, workers) if workers > 1 else None
    with BackgroundServer(create_app(rt, api_key=KEY, default_spec="off", worker=worker)) as server:
        yield rt, server

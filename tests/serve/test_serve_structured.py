"""Structured output over real HTTP with the official `openai` client (serve/structured.py): a schema
llguidance refuses is a 400 with its message; on the real qwen2.5-coder-0.5b, `response_format`
json_schema (strict) and json_object answers parse and validate (pydantic), streamed or not, through
`chat.completions.create` and `chat.completions.parse`, on /v1/completions too, and every speculative
mode answers exactly what constrained plain greedy answers, alone and in the batch worker.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from fake_runtime import make_test_runtime
from openai_chat import KEY, chat
from real_models import real_runtime
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int
    languages: list[str] = Field(max_length=3)


def city_format(strict: bool = True) -> dict:
    schema = City.model_json_schema()
    schema["properties"]["languages"]["items"]["maxLength"] = 20
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": strict}}


QUESTION = "Describe Paris as JSON: its name, country, population and up to three languages spoken there."


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


# -- bad schemas: the fake runtime is enough --------------------------------------------------------
@pytest.fixture(scope="module")
def fake_server():
    with BackgroundServer(create_app(make_test_runtime(max_seq=256), api_key=KEY)) as s:
        yield s


@pytest.mark.parametrize("schema", [{"type": "bogus"}, {"type": "string", "pattern": "(unclosed"},
                                    {"$ref": "#/$defs/missing"}])
def test_a_schema_llguidance_refuses_is_a_400_with_its_message(fake_server, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    with client_of(fake_server) as client:
        with pytest.raises(openai.BadRequestError) as err:
            chat(client, make_test_runtime(), "hi", response_format=fmt)
        with pytest.raises(openai.BadRequestError) as err2:
            client.completions.create(model=make_test_runtime().name, prompt="hi", extra_body={"response_format": fmt})
    for e in (err.value, err2.value):
        body = e.body if isinstance(e.body, dict) else {}
        assert body.get("param") == "response_format" and body.get("code") == "invalid_json_schema"
        assert "invalid JSON schema" in body.get("message", ""), body


def test_a_response_format_of_another_type_is_a_400(fake_server):
    with client_of(fake_server) as client, pytest.raises(openai.BadRequestError):
        chat(client, make_test_runtime(), "hi", response_format={"type": "yaml"})


# -- the real model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "parallel-2"])
def real_server(request):
    rt = real_runtime()
    worker = BatchWorker(rt, request.param) if request.param > 1 else None
    with BackgroundServer(create_app(rt, api_key=KEY, worker=worker)) as s:
        yield s


@pytest.mark.real
def test_a_strict_json_schema_answer_validates_and_equals_constrained_greedy_in_every_mode(real_server):
    rt = real_runtime()
    with client_of(real_server) as client:
        answers = {spec: chat(client, rt, QUESTION, response_format=city_format(), max_tokens=80,
                              extra_body={"speculative": spec})
                   for spec in ["off", "ngram", "auto"]}
    ref = answers["off"].choices[0]
    assert ref.finish_reason == "stop", ref.message.content
    City.model_validate_json(ref.message.content)
    for spec, answer in answers.items():
        assert answer.choices[0].message.content == ref.message.content, spec
        assert answer.usage.completion_tokens == answers["off"].usage.completion_tokens


@pytest.mark.real
def test_the_openai_clients_parse_helper_gets_a_pydantic_object(real_server):
    rt = real_runtime()
    with client_of(real_server) as client:
        done = client.chat.completions.parse(model=rt.name, messages=[{"role": "user", "content": QUESTION}],
                                             response_format=City, max_tokens=80,
                                             extra_body={"speculative": "ngram"})
    city = done.choices[0].message.parsed
    assert isinstance(city, City) and city.name


@pytest.mark.real
def test_a_streamed_json_object_answer_parses_and_a_short_budget_is_a_length_finish(real_server):
    rt = real_runtime()
    with client_of(real_server) as client:
        stream = chat(client, rt, 'The Moon as a JSON object with the keys "name" and "radius_km", nothing else.',
                      response_format={"type": "json_object"}, max_tokens=60, stream=True,
                      extra_body={"speculative": "ngram"})
        pieces, finish = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert finish == "stop" and isinstance(json.loads("".join(pieces)), dict), "".join(pieces)
        cut = chat(client, rt, QUESTION, response_format=city_format(), max_tokens=5)
        assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content.startswith("{")
        text = client.completions.create(model=rt.name, prompt="A JSON object describing Paris:", max_tokens=80,
                                         extra_body={"response_format": city_format(), "speculative": "auto"})
    assert text.choices[0].finish_reason == "stop"
    City.model_validate_json(text.choices[0].text)

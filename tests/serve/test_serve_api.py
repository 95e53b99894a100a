"""The HTTP app in-process (no sockets): request → GenerationRequest mapping, response shapes, SSE
framing, errors in OpenAI's shape, auth, and the published OpenAPI schema."""

from __future__ import annotations

import hashlib
import json

import pytest
from fastapi.testclient import TestClient

from fake_runtime import FakeRuntime, is_fake, make_test_runtime
from speczoo.serve.app import create_app
from speczoo.serve.schemas import ChatCompletionChunk, CompletionChunk


@pytest.fixture(scope="module")
def runtime():
    return make_test_runtime(max_seq=512)


@pytest.fixture(scope="module")
def client(runtime):
    with TestClient(create_app(runtime)) as c:
        yield c


def chat_body(runtime, text="hello there", **kw):
    return {"model": runtime.name, "messages": [{"role": "user", "content": text}], **kw}


def sse_payloads(text: str) -> list[str]:
    """Split an SSE body into its data payloads, checking the framing on the way."""
    assert text.endswith("\n\n"), "every event ends with a blank line"
    blocks = text.split("\n\n")[:-1]
    out = []
    for block in blocks:
        lines = block.split("\n")
        assert len(lines) == 1 and lines[0].startswith("data: "), f"bad SSE block {block!r}"
        out.append(lines[0][len("data: "):])
    return out


def test_models_lists_the_runtime(client, runtime):
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == [runtime.name]
    assert data["data"][0]["object"] == "model"
    assert client.get(f"/v1/models/{runtime.name}").json()["id"] == runtime.name
    assert client.get("/v1/models/nope").status_code == 404


def test_request_maps_to_generation_request(runtime):
    if not is_fake(runtime):
        pytest.skip("reads the fake runtime's log of requests")
    rt = FakeRuntime(max_seq=512)
    with TestClient(create_app(rt, default_spec="ngram")) as c:
        r = c.post("/v1/chat/completions", json=chat_body(
            rt, "hi", max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=11, stop=["zz", "yy"],
            speculative="draft"))
        assert r.status_code == 200, r.text
        req = rt.log[-1].request
        prompt = rt.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
        assert req.prompt_ids == rt.tokenizer.encode(prompt)
        assert req.max_new_tokens == 7 and req.stop == ["zz", "yy"] and req.spec == "draft"
        s = req.sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.5, 0.9, 5, 11)
        # defaults: greedy, the server's --spec, max_tokens = the room left in the context
        c.post("/v1/completions", json={"model": rt.name, "prompt": "abc", "stop": "q"})
        req = rt.log[-1].request
        assert req.prompt_ids == list(b"abc") and req.spec == "ngram" and req.stop == ["q"]
        assert req.sampling.greedy and req.max_new_tokens == 512 - 3
        # token-id prompts and content parts
        c.post("/v1/completions", json={"model": rt.name, "prompt": [97, 98], "max_tokens": 3})
        assert rt.log[-1].request.prompt_ids == [97, 98]
        c.post("/v1/chat/completions", json={"model": rt.name, "max_completion_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]})
        assert rt.log[-1].request.prompt_ids == req_ids_for(rt, "hi")
        assert rt.log[-1].request.max_new_tokens == 4


def req_ids_for(rt, text):
    return rt.tokenizer.encode(rt.tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def test_chat_completion_shape_and_usage(client, runtime):
    r = client.post("/v1/chat/completions", json=chat_body(runtime, max_tokens=12, speculative="off"))
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-")
    assert j["model"] == runtime.name and isinstance(j["created"], int)
    (choice,) = j["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    u = j["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 1 <= u["completion_tokens"] <= 12
    for key in ("accepted_draft_tokens", "draft_tokens", "rounds", "tokens_per_second", "drafter"):
        assert key in u
    assert u["drafter"] == "off" and u["draft_tokens"] == 0
    assert u["rounds"] >= 1


def test_stream_framing_and_content_equals_non_stream(client, runtime):
    body = chat_body(runtime, "stream me", max_tokens=40, speculative="ngram")
    whole = client.post("/v1/chat/completions", json=body).json()
    r = client.post("/v1/chat/completions", json={**body, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["delta"] == {}
    assert finals[0]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    rounds = [c["speczoo"] for c in chunks if c.get("speczoo") and c["speczoo"]["tokens"]]
    assert len(rounds) == usage_chunk["usage"]["rounds"]
    assert sum(r["accepted"] for r in rounds) == usage_chunk["usage"]["accepted_draft_tokens"]


def test_stream_without_include_usage_has_no_usage_chunk(client, runtime):
    r = client.post("/v1/chat/completions", json=chat_body(runtime, max_tokens=5, stream=True))
    chunks = [json.loads(p) for p in sse_payloads(r.text)[:-1]]
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)


def test_completion_stream_and_not(client, runtime):
    body = {"model": runtime.name, "prompt": "def add(a, b):", "max_tokens": 16, "speculative": "off"}
    whole = client.post("/v1/completions", json=body).json()
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    r = client.post("/v1/completions", json={**body, "stream": True})
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    for c in chunks:
        CompletionChunk.model_validate(c)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_greedy_output_is_the_same_in_every_spec_mode(client, runtime):
    texts = set()
    for mode in runtime.spec_modes:
        if mode == "draft" and "draft" not in runtime.spec_modes:
            continue
        j = client.post("/v1/chat/completions", json=chat_body(runtime, "same?", max_tokens=24,
                                                                speculative=mode)).json()
        texts.add(j["choices"][0]["message"]["content"])
    assert len(texts) == 1


def test_stop_strings_are_cut(client, runtime):
    body = chat_body(runtime, "stop test", max_tokens=60, speculative="off")
    full = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    stop = full[10:13]
    assert stop.strip(), "pick a non-blank stop string"
    for stream in (False, True):
        r = client.post("/v1/chat/completions", json={**body, "stop": stop, "stream": stream})
        if stream:
            chunks = [json.loads(p) for p in sse_payloads(r.text)[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            text, finish = r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"]
        assert text == full[:full.index(stop)] and finish == "stop"


def error_of(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"'])
def test_malformed_json_is_400(client, raw):
    err = error_of(client.post("/v1/chat/completions", content=raw,
                               headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"]


@pytest.mark.parametrize("patch", [
    {"temperature": -1}, {"temperature": "hot"}, {"top_p": 0}, {"top_p": 1.5}, {"max_tokens": 0},
    {"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]}, {"n": 2},
    {"speculative": "warp"}, {"stop": ["a", "b", "c", "d", "e"]}, {"stop": ""}, {"presence_penalty": 2.5},
    {"seed": -3}, {"stream": "yes please"},
])
def test_invalid_params_are_400(client, runtime, patch):
    error_of(client.post("/v1/chat/completions", json={**chat_body(runtime), **patch}), 400)


def test_missing_model_field_is_400_and_unknown_model_404(client, runtime):
    body = chat_body(runtime)
    del body["model"]
    error_of(client.post("/v1/chat/completions", json=body), 400)
    err = error_of(client.post("/v1/chat/completions", json={**chat_body(runtime), "model": "gpt-9"}), 404)
    assert err["code"] == "model_not_found"
    error_of(client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404)


def test_prompt_over_context_is_400(client, runtime):
    err = error_of(client.post("/v1/completions", json={
        "model": runtime.name, "prompt": "x", "max_tokens": runtime.max_seq}), 400)
    assert err["code"] == "context_length_exceeded"
    long_prompt = "word " * (runtime.max_seq * 2)
    for stream in (False, True):
        err = error_of(client.post("/v1/chat/completions", json=chat_body(runtime, long_prompt,
                                                                          stream=stream)), 400)
        assert err["code"] == "context_length_exceeded"
    # exactly at the limit is accepted (streamed, and dropped after the first chunk to stay fast)
    with client.stream("POST", "/v1/completions", json={
            "model": runtime.name, "prompt": [65], "max_tokens": runtime.max_seq - 1, "stream": True}) as r:
        assert r.status_code == 200
        assert next(r.iter_lines()).startswith("data: {")


def test_spec_mode_not_offered_is_400(runtime):
    if not is_fake(runtime):
        pytest.skip("builds a fake runtime without a draft model")
    rt = FakeRuntime(spec_modes=["off", "ngram", "auto"])
    with TestClient(create_app(rt)) as c:
        err = error_of(c.post("/v1/chat/completions", json=chat_body(rt, speculative="draft")), 400)
        assert "draft" in err["message"]
        props = c.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
        assert props["speculative"]["anyOf"][0]["enum"] == ["off", "ngram", "auto"]


def test_api_key(runtime):
    with TestClient(create_app(runtime, api_key="s3cret")) as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            err = error_of(c.get("/v1/models", headers=headers), 401)
            assert err["type"] == "authentication_error"
            error_of(c.post("/v1/chat/completions", json=chat_body(runtime), headers=headers), 401)
            # a wrong key wins over a malformed body
            error_of(c.post("/v1/chat/completions", content=b"{", headers=headers), 401)
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/models", headers=ok).status_code == 200
        r = c.post("/v1/chat/completions", json=chat_body(runtime, max_tokens=3), headers=ok)
        assert r.status_code == 200, r.text
        assert c.get("/").status_code == 200   # the page itself is public; it asks for the key
        schema = c.get("/openapi.json").json()
        assert "HTTPBearer" in schema["components"]["securitySchemes"]


def test_a_request_carries_its_api_key_as_its_tenant():
    """The suffix drafter's memory is keyed by the request's API key (a digest of it), None without --api-key."""
    for api_key, headers, tenant in [(None, {"Authorization": "Bearer anything"}, None),
                                     ("s3cret", {"Authorization": "Bearer s3cret"},
                                      hashlib.sha256(b"s3cret").hexdigest())]:
        rt = FakeRuntime(max_seq=512)
        with TestClient(create_app(rt, api_key=api_key)) as c:
            r = c.post("/v1/chat/completions", json=chat_body(rt, max_tokens=3), headers=headers)
            assert r.status_code == 200, r.text
            r = c.post("/api/chat", json={"model": rt.name, "messages": [{"role": "user", "content": "hi"}],
                                          "stream": False, "options": {"num_predict": 3}}, headers=headers)
            assert r.status_code == 200, r.text     # Ollama's API: the same tenant
        assert [e.request.tenant for e in rt.log] == [tenant, tenant]


def test_openapi_schema_is_published_and_says_400_not_422(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in ("/v1/models", "/v1/chat/completions", "/v1/completions"):
        assert path in paths
    for path, ops in paths.items():
        for op in ops.values():
            assert "422" not in op["responses"], f"{path} still documents 422"
    post = paths["/v1/chat/completions"]["post"]
    assert {"200", "400", "404"} <= set(post["responses"])
    assert "text/event-stream" in post["responses"]["200"]["content"]
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert "speculative" in props and "stop" in props and "seed" in props


def test_page_and_static_files(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'aria-live="polite"' in r.text and "⚡Spec" in r.text
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200


def test_openapi_constraints_are_json_schema_keywords(client):
    """pydantic publishes constraints it cannot place as raw "ge"/"le" keys, which no validator reads."""
    text = json.dumps(client.get("/openapi.json").json())
    for raw in ('"ge":', '"le":', '"gt":', '"lt":'):
        assert raw not in text, f"the schema carries a raw {raw} constraint"
    schema = client.get("/openapi.json").json()
    event = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    assert "ChatCompletionChunk" in json.dumps(event)
    assert "ChatCompletionChunk" in schema["components"]["schemas"]


def sse_blocks(text: str) -> list[str]:
    """An SSE body's blocks, comments (': ...') included."""
    assert text.endswith("\n\n"), "every event ends with a blank line"
    return text.split("\n\n")[:-1]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a long prompt"}]}),
    ("/v1/completions", {"prompt": "a long prompt"}),
])
def test_stream_sends_keepalive_comments_while_the_prompt_is_prefilled(path, body):
    slow = FakeRuntime(max_seq=512, prefill_delay=0.45)
    request = {"model": slow.name, "max_tokens": 12, "stream": True, **body}
    with TestClient(create_app(slow, keepalive=0.1)) as c:
        r = c.post(path, json=request)
        assert r.status_code == 200
        blocks = sse_blocks(r.text)
        slow.prefill_delay = 0.0
        quick = sse_blocks(c.post(path, json=request).text)
    first_token = next(i for i, b in enumerate(blocks) if '"speczoo"' in b)
    alive = [i for i, b in enumerate(blocks) if b.startswith(":")]
    assert all(b == ": keep-alive" for b in (blocks[i] for i in alive))
    assert len(alive) >= 2, f"no keep-alive during a 0.45 s prefill at 0.1 s intervals: {blocks[:6]}"
    assert max(alive) < first_token, "keep-alives came after the answer started (this fake is quick then)"
    data = [b for b in blocks if not b.startswith(":")]
    assert [json.loads(b[6:])["choices"] for b in data[:-1]] == \
        [json.loads(b[6:])["choices"] for b in quick[:-1]], "the keep-alives changed the events"
    assert not any(b.startswith(":") for b in quick), "a quick answer needs no keep-alive"


def test_keepalive_must_be_positive(runtime):
    with pytest.raises(ValueError, match="keepalive"):
        create_app(runtime, keepalive=0)


def test_prompt_token_ids_outside_the_vocabulary_are_400_and_the_schema_says_so(client, runtime):
    # Found by schemathesis on the real model: an id past the embedding table was a 500 (IndexError).
    for stream in (False, True):
        r = client.post("/v1/completions", json={"model": runtime.name, "prompt": [1, runtime.vocab_size],
                                                 "max_tokens": 2, "stream": stream})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert str(runtime.vocab_size) in r.json()["error"]["message"]
    ok = client.post("/v1/completions", json={"model": runtime.name, "prompt": [1, runtime.vocab_size - 1],
                                              "max_tokens": 2})
    assert ok.status_code == 200
    prompt = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]
    ids = next(o for o in prompt["anyOf"] if o.get("type") == "array")
    assert ids["items"]["maximum"] == runtime.vocab_size - 1

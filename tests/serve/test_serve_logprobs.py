"""Log-probabilities on OpenAI's API (serve/logprobs.py, through generation.py), driven by the official
`openai` client on a real uvicorn server: chat's `logprobs.content` and completions' `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`, whole and streamed alike, the same in every
speculative mode, no token past a stop string; bad values are 400s. The fast tests run on the fake
runtime; the `real` one on the pulled qwen2.5-coder-0.5b, where speculation must not move a single float."""

from __future__ import annotations

import openai
import pytest

from fake_runtime import FakeRuntime
from openai_chat import KEY, chat
from real_models import real_runtime
from speczoo.events import TokenLogprob
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.logprobs import LogprobTrack, completion_logprobs, token_text


@pytest.fixture(scope="module")
def runtime():
    return FakeRuntime(max_seq=512)


@pytest.fixture(scope="module")
def client(runtime):
    with BackgroundServer(create_app(runtime, api_key=KEY)) as s:
        with openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=600) as c:
            yield c


def chat_logprobs(client, runtime, text, stream: bool, **kw) -> tuple[str, list]:
    """The answer's text and its logprobs.content, whole or gathered from the stream."""
    if not stream:
        r = chat(client, runtime, text, logprobs=True, **kw)
        return r.choices[0].message.content, r.choices[0].logprobs.content
    text_parts, lps = [], []
    for c in chat(client, runtime, text, logprobs=True, stream=True, **kw):
        text_parts.append(c.choices[0].delta.content or "")
        lps += c.choices[0].logprobs.content if c.choices[0].logprobs else []
    return "".join(text_parts), lps


def test_chat_logprobs_whole_and_streamed_in_every_mode(client, runtime):
    text, whole = chat_logprobs(client, runtime, "hello", False, max_tokens=30, top_logprobs=3)
    assert len(whole) == 30 and bytes(b for t in whole for b in t.bytes).decode() == text
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in whole)
    for mode in ("off", "ngram", "auto"):
        for stream in (False, True):
            assert chat_logprobs(client, runtime, "hello", stream, max_tokens=30, top_logprobs=3,
                                 extra_body={"speculative": mode}) == (text, whole), (mode, stream)
    _, none = chat_logprobs(client, runtime, "hello", False, max_tokens=5)
    assert none and all(t.top_logprobs == [] for t in none)
    assert chat(client, runtime, "hello", max_tokens=5).choices[0].logprobs is None


def test_no_token_past_a_stop_string_is_reported(client, runtime):
    text, _ = chat_logprobs(client, runtime, "hello", False, max_tokens=60)
    stop = next(w for w in text.split()[3:] if w.isascii())
    for mode in ("off", "ngram"):
        for stream in (False, True):
            cut, lps = chat_logprobs(client, runtime, "hello", stream, max_tokens=60, stop=[stop],
                                     extra_body={"speculative": mode})
            assert cut == text[:text.index(stop)]
            assert bytes(b for t in lps for b in t.bytes).decode() == cut, (mode, stream)


def test_completion_logprobs_whole_and_streamed(client, runtime):
    r = client.completions.create(model=runtime.name, prompt="def f():", max_tokens=20, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 20
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(tok in top and 2 <= len(top) <= 3 for tok, top in zip(lp.tokens, lp.top_logprobs))
    got = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    for c in client.completions.create(model=runtime.name, prompt="def f():", max_tokens=20, logprobs=2,
                                       stream=True, extra_body={"speculative": "ngram"}):
        if c.choices[0].logprobs:
            for k in got:
                got[k] += getattr(c.choices[0].logprobs, k)
    assert got == {k: getattr(lp, k) for k in got}


@pytest.mark.parametrize("kw", [dict(top_logprobs=2), dict(logprobs=True, top_logprobs=21)])
def test_bad_chat_logprobs_are_400(client, runtime, kw):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        chat(client, runtime, "x", max_tokens=3, **kw)


def test_bad_completion_logprobs_are_400(client, runtime):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=runtime.name, prompt="x", max_tokens=3, logprobs=6)


def test_a_token_is_handed_out_with_its_text():
    pieces = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"b"}               # "aéb", é split over two tokens
    track = LogprobTrack(pieces.__getitem__)
    track.add([TokenLogprob(i, -float(i), ((i, -float(i)),)) for i in (1, 2, 3, 4)])
    assert track.take(0) == []
    first = track.take(1)
    assert [t.text for t in first] == ["a"] and first[0].offset == 0
    rest = track.take(3)
    assert [t.text for t in rest] == ["bytes:\\xc3", "bytes:\\xa9", "b"] and [t.offset for t in rest] == [1, 1, 2]
    out = completion_logprobs(first + rest)
    assert out["text_offset"] == [0, 1, 1, 2] and out["top_logprobs"][0] == {"a": -1.0}
    assert token_text("é".encode()) == "é"


@pytest.mark.real
def test_the_real_05b_reports_the_same_floats_with_speculation_on_and_off():
    rt = real_runtime(max_seq=1024)
    ask = "Repeat this line exactly: for i in range(10): print(i * i)"
    with BackgroundServer(create_app(rt)) as s:
        with openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=600) as c:
            runs = {mode: c.chat.completions.create(
                        model=rt.name, messages=[{"role": "user", "content": ask}], max_tokens=32, logprobs=True,
                        top_logprobs=5, extra_body={"speculative": mode})
                    for mode in ("off", "ngram", "auto")}
    plain = runs["off"].choices[0]
    assert len(plain.logprobs.content) == runs["off"].usage.completion_tokens
    for t in plain.logprobs.content:          # greedy: the chosen token heads its row's top 5
        assert t.top_logprobs[0].logprob == t.logprob and len(t.top_logprobs) == 5
    for mode in ("ngram", "auto"):
        r = runs[mode]
        assert r.usage.accepted_draft_tokens > 0, mode
        assert r.choices[0].message.content == plain.message.content
        assert r.choices[0].logprobs.content == plain.logprobs.content, mode      # exact floats

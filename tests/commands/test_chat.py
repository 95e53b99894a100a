"""The terminal chat's logic through its feed-lines interface: streaming, multi-turn history through
the chat template, /spec, /stats, /reset, /save, /quit, --no-think, and the CLI wiring."""

from __future__ import annotations

import io
import json

import pytest

from fake_runtime import FakeRuntime, make_test_runtime
from speczoo.chat import THINK_PRESEED, ChatSession, render_chat_prompt
from speczoo.request import GenerationRequest


@pytest.fixture(scope="module")
def runtime():
    return make_test_runtime(max_seq=2048)


def session(runtime, **kw) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    return ChatSession(runtime, out=out, max_tokens=kw.pop("max_tokens", 40), **kw), out


def direct_answer(runtime, messages, spec="off", max_tokens=40) -> str:
    """What the runtime says for `messages` when called directly (the oracle for the chat)."""
    tok = runtime.tokenizer
    ids = tok.encode(render_chat_prompt(tok, messages))
    gen = runtime.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=max_tokens, spec=spec))
    try:
        return [e for e in gen][-1].text
    finally:
        gen.close()


def test_answer_streams_to_output_and_history_grows(runtime):
    s, out = session(runtime, spec="off")
    s.feed(["hello", "and again"])
    first = direct_answer(runtime, [{"role": "user", "content": "hello"}])
    second = direct_answer(runtime, [{"role": "user", "content": "hello"},
                                     {"role": "assistant", "content": first},
                                     {"role": "user", "content": "and again"}])
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    assert s.messages[1]["content"] == first and s.messages[3]["content"] == second
    assert out.getvalue() == first + "\n" + second + "\n"


def test_spec_command_switches_mode_and_output_stays_the_same(runtime):
    s, out = session(runtime, spec="off")
    s.feed(["/spec", "/spec ngram", "hi", "/stats"])
    text = out.getvalue()
    assert "[spec: off;" in text and "[spec: ngram]" in text
    assert s.spec == "ngram" and s.last.drafter != "off"
    s2, _ = session(runtime, spec="off")
    s2.feed(["hi"])
    assert s.messages[1]["content"] == s2.messages[1]["content"], "spec changed the greedy answer"
    assert "accepted/round" in text and "tok/s" in text and "drafter:" in text


def test_spec_on_picks_a_speculative_mode_and_bad_modes_are_reported(runtime):
    s, out = session(runtime, spec="off")
    s.feed(["/spec on"])
    assert s.spec != "off" and s.spec in runtime.spec_modes
    s.feed(["/spec warp"])
    assert "unknown speculative mode 'warp'" in out.getvalue()
    assert s.spec != "off"
    with pytest.raises(ValueError):
        ChatSession(runtime, spec="warp")


def test_stats_before_any_answer_and_after(runtime):
    s, out = session(runtime)
    s.feed(["/stats"])
    assert "[no answer yet]" in out.getvalue()
    s.feed(["one", "two", "/stats"])
    assert s.totals.answers == 2
    assert "session: 2 answers" in out.getvalue()


def test_reset_and_system_message(runtime):
    s, out = session(runtime, system="You are terse.")
    s.feed(["hi", "/reset"])
    assert s.messages == [{"role": "system", "content": "You are terse."}]
    assert "[conversation cleared]" in out.getvalue()


def test_save_writes_the_conversation_as_json(runtime, tmp_path):
    s, out = session(runtime)
    path = tmp_path / "conv.json"
    s.feed(["hi there", f"/save {path}"])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["model"] == runtime.name and data["messages"] == s.messages
    assert data["last_stats"]["new_tokens"] >= 1
    s.feed(["/save"])
    assert "usage: /save FILE" in out.getvalue()
    s.feed([f"/save {tmp_path}/no/such/dir/x.json"])
    assert "cannot save" in out.getvalue()


def test_quit_stops_reading_lines(runtime):
    s, _ = session(runtime)
    s.feed(["/quit", "never asked"])
    assert s.messages == []


def test_unknown_command_and_help(runtime):
    s, out = session(runtime)
    s.feed(["/frobnicate", "/help", "", "   "])
    assert "unknown command /frobnicate" in out.getvalue() and "/save FILE" in out.getvalue()
    assert s.messages == []


def test_no_think_preseeds_an_empty_think_block():
    rt = FakeRuntime()
    s, _ = session(rt, no_think=True)
    s.feed(["think?"])
    prompt = rt.tokenizer.decode(rt.log[-1].request.prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n" + THINK_PRESEED)
    s2, _ = session(rt)
    s2.feed(["think?"])
    assert not rt.tokenizer.decode(rt.log[-1].request.prompt_ids).endswith(THINK_PRESEED)


def test_conversation_over_the_context_is_refused_not_crashed():
    rt = FakeRuntime(max_seq=120)
    s, out = session(rt, max_tokens=30)
    s.feed(["x" * 200])
    assert "no longer fits the context" in out.getvalue()
    assert s.messages == []
    s.feed(["short"])   # still usable
    assert len(s.messages) == 2


def test_max_tokens_is_clipped_to_the_room_left():
    rt = FakeRuntime(max_seq=100)
    s, _ = session(rt, max_tokens=500)
    s.feed(["hi"])
    req = rt.log[-1].request
    assert len(req.prompt_ids) + req.max_new_tokens == 100


def test_ctrl_c_during_an_answer_closes_the_generation():
    class CtrlCOnce(io.StringIO):
        """Raises KeyboardInterrupt on the 4th write, as Ctrl-C would while an answer streams."""
        writes = 0

        def write(self, text):
            CtrlCOnce.writes += 1
            if CtrlCOnce.writes == 4:
                raise KeyboardInterrupt
            return super().write(text)

    rt = FakeRuntime()
    out = CtrlCOnce()
    s = ChatSession(rt, spec="off", max_tokens=40, out=out)
    s.feed(["hi"])
    assert "[stopped]" in out.getvalue()
    assert rt.log[0].closed_early and not rt.log[0].finished   # the generator was closed
    assert s.messages[-1]["role"] == "assistant"               # the partial answer is kept
    s.feed(["again"])                                            # the runtime is free again
    assert rt.log[1].finished


def test_cli_registers_chat_and_serve():
    from speczoo.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["chat", "m", "--spec", "ngram", "--no-think", "--max-tokens", "9"])
    assert (args.model, args.spec, args.no_think, args.max_tokens) == ("m", "ngram", True, 9)
    args = parser.parse_args(["serve", "--port", "9001", "--api-key", "k"])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 9001, "k")
    assert args.model == "qwen2.5-coder-0.5b"


def test_chat_command_wires_the_terminal_to_a_session(monkeypatch, capsys):
    import builtins

    import speczoo.runtime
    from speczoo.cli import main

    rt = FakeRuntime()
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: rt)
    lines = iter(["hello", "/spec off", "/stats", "/quit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert main(["chat", "fake-model", "--spec", "ngram", "--max-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "speczoo chat with fake-model (spec: ngram)" in out
    assert "[spec: off]" in out and "drafter: ngram" in out
    assert rt.log[0].request.max_new_tokens == 12 and rt.log[0].request.spec == "ngram"


def test_serve_command_builds_the_app_and_binds_loopback(monkeypatch, capsys):
    import uvicorn

    import speczoo.runtime
    from speczoo.cli import main

    rt = FakeRuntime()
    calls = {}
    monkeypatch.setattr(speczoo.runtime, "load_runtime",
                        lambda target, draft=None, backend=None, max_seq=4096, **kw:
                        calls.setdefault("load", (target, draft, max_seq)) and rt)
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: calls.update(app=app, host=host, port=port))
    assert main(["serve", "fake-model", "--port", "8123", "--max-seq", "777"]) == 0
    assert calls["load"] == ("fake-model", None, 777)
    assert (calls["host"], calls["port"]) == ("127.0.0.1", 8123)
    assert "warning" not in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0"]) == 0
    assert "without an API key" in capsys.readouterr().err
    assert main(["serve", "--spec", "warp"]) == 2      # a clear error, not a traceback
    assert "warp" in capsys.readouterr().err


@pytest.mark.parametrize("argv, draft, spec", [
    (["qwen2.5-coder-1.5b"], "qwen2.5-coder-0.5b", "auto"),                  # default --spec auto
    (["qwen2.5-coder-1.5b", "--spec", "draft"], "qwen2.5-coder-0.5b", "draft"),
    (["qwen2.5-coder-1.5b", "--spec", "off"], None, "off"),
    (["qwen2.5-coder-1.5b", "--spec", "ngram"], None, "ngram"),
    (["qwen2.5-coder-1.5b", "--draft", "my-draft"], "my-draft", "auto"),
    (["qwen2.5-coder-1.5b", "--spec", "draft:my-draft"], "my-draft", "draft"),
    (["qwen2.5-coder-0.5b"], None, "auto"),              # a draft model itself: no default draft
])
@pytest.mark.parametrize("command", ["chat", "serve"])
def test_chat_and_serve_load_the_zoos_default_draft(monkeypatch, command, argv, draft, spec):
    import builtins

    import uvicorn

    import speczoo.runtime
    from speczoo.cli import main

    rt = FakeRuntime()
    loaded, served = {}, {}
    monkeypatch.setattr(speczoo.runtime, "load_runtime",
                        lambda target, draft=None, backend=None, max_seq=4096, **kw:
                        loaded.update(target=target, draft=draft) or rt)
    monkeypatch.setattr(builtins, "input", lambda prompt="": "/quit")
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served.update(app=app))
    assert main([command, *argv]) == 0
    assert loaded == {"target": argv[0], "draft": draft}
    if command == "serve":
        body = {"model": rt.name, "prompt": "x", "max_tokens": 2}
        from fastapi.testclient import TestClient
        with TestClient(served["app"]) as c:
            assert c.post("/v1/completions", json=body).status_code == 200
        assert rt.log[-1].request.spec == spec          # the server's default mode, without ":NAME"


def test_spec_draft_without_a_draft_is_a_clear_error(monkeypatch, capsys):
    import speczoo.runtime
    from speczoo.cli import main

    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: pytest.fail("loaded a model"))
    assert main(["chat", "qwen2.5-coder-0.5b", "--spec", "draft"]) == 2
    assert "--draft NAME" in capsys.readouterr().err
    assert main(["serve", "qwen2.5-coder-1.5b", "--spec", "draft:a", "--draft", "b"]) == 2
    assert "different drafts" in capsys.readouterr().err

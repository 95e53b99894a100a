"""`speczoo suite --endpoint`: the suite against OpenAI-compatible servers by URL (bench/endpoint.py,
bench/suite_endpoint.py, bench/peers_table.py).

The fast tests serve the fake runtime through the real app on a real uvicorn server (as tests/serve do)
and drive it by URL: one server, its modes picked per request by speczoo's `speculative` field; a lossy
"mode" (sampling) to prove inequality is caught; resumption; a dead endpoint and an HTTP error; the
command with local methods, llama-server's modes (tests/fake_llama_server.py) and servers by URL in one
table. The `real` test runs a `speczoo serve` subprocess on the pulled 0.5B."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fake_runtime import FakeRuntime, FakeTokenizer, fake_local_suite
from real_models import QWEN_NAME
from speczoo.bench import peers_table
from speczoo.bench.endpoint import EndpointClient, EndpointError, parse_endpoint
from speczoo.bench.questions import load_questions, select
from speczoo.bench.suite import RESULTS, SUMMARY, SuiteSettings, load_results, run_suite, turn_ids
from speczoo.bench.suite_endpoint import references, run_endpoints
from speczoo.cli import main
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer

GEN = 12
FAKE_LLAMA = str(Path(__file__).parents[1] / "fake_llama_server.py")
QUESTIONS = select(load_questions("builtin"), ["code_edit", "multi_turn"], limit=2)   # multi_turn: 2-3 turns


@pytest.fixture
def served():
    runtime = FakeRuntime(max_seq=100_000)
    with BackgroundServer(create_app(runtime)) as server:
        yield runtime, server


def ep(server, label, **body):
    extra = "".join(f",{k}={v}" for k, v in body.items())
    return parse_endpoint(f"{server.url},{label}{extra}")


def test_parse_endpoint():
    e = parse_endpoint("http://h:1/,vllm:ngram,speculative=ngram,n=3,stop=[\"x\"]")
    assert (e.url, e.base_url, e.label, e.system, e.mode, e.greedy) == ("http://h:1", "http://h:1/v1", "vllm:ngram",
                                                                        "vllm", "ngram", False)
    assert e.body == {"speculative": "ngram", "n": 3, "stop": ["x"]}
    assert parse_endpoint("https://h/v1").base_url == "https://h/v1"
    assert parse_endpoint("http://h:2", index=2).label == "server2:greedy"
    assert parse_endpoint("http://h:2,model=m").body == {"model": "m"} and parse_endpoint("http://h,x:off").greedy
    for bad, why in [("h:1", "must start with http"), ("http://h,nomode", "SYSTEM:MODE"),
                     ("http://h,a:b,oops", "not KEY=VALUE")]:
        with pytest.raises(ValueError, match=why):
            parse_endpoint(bad)


def test_every_system_needs_its_greedy_and_labels_are_unique():
    a, b, c = (parse_endpoint(f"http://h,{label}") for label in ("v:greedy", "v:ngram", "w:ngram"))
    assert references([a, b]) == {"v:greedy": "v:greedy", "v:ngram": "v:greedy"}
    with pytest.raises(ValueError, match="system w has no greedy endpoint"):
        references([a, b, c])
    with pytest.raises(ValueError, match="used twice"):
        references([a, a])
    with pytest.raises(ValueError, match="used twice"):
        references([a], taken={"v:greedy"})


def test_endpoints_beside_the_local_suite(served, tmp_path):
    runtime, server = served
    local = FakeRuntime(max_seq=100_000)
    settings = SuiteSettings(methods=["off"], max_new_tokens=GEN)
    outcome = run_suite(local, QUESTIONS, settings, tmp_path, progress=False, plot=False)
    endpoints = [ep(server, "serve:off", speculative="off"), ep(server, "serve:ngram", speculative="ngram"),
                 ep(server, "serve:hot", speculative="off", temperature=0.9, seed=1)]
    rows = run_endpoints(local.tokenizer, QUESTIONS, settings, local.name, endpoints, tmp_path, log=lambda _: None)
    assert [r["method"] for r in rows] == [e.label for e in endpoints for _ in QUESTIONS]
    off = {r["question_id"]: r for r in outcome.rows}
    by = {(r["question_id"], r["method"]): r for r in rows}
    for q in QUESTIONS:
        greedy, ngram, hot = (by[(q.question_id, m)] for m in ("serve:off", "serve:ngram", "serve:hot"))
        assert greedy["texts"] == off[q.question_id]["texts"] and greedy["equals_off"] and greedy["lossless"]
        assert ngram["lossless"] and ngram["reference"] == "serve:off" and ngram["ids"] == off[q.question_id]["ids"]
        assert not hot["lossless"] and hot["first_mismatch"] is not None and not hot["equals_off"]
        assert greedy["tokens"] == off[q.question_id]["tokens"], "tokens are the server's completion_tokens"
        # every turn's prompt: the template over off's earlier answers, counted by the server as speczoo does
        assert greedy["prompt_tokens"] == [len(turn_ids(local.tokenizer, q, off[q.question_id]["texts"][:t]))
                                           for t in range(len(q.turns))]
        assert greedy["prompt_source"] == "off" and greedy["token_count"] == "usage"
        assert ngram["rounds"] > 0 and ngram["drafted"] > 0, "speczoo serve's usage counts came through"
        assert greedy["total_seconds"] >= greedy["seconds"] and greedy["tok_s_total"] <= greedy["tok_s"]
    served_prompts = [g.request for g in runtime.log]
    assert [r.max_new_tokens for r in served_prompts].count(4) == 3, "one 4-token warm-up per endpoint"
    timed = [r for r in served_prompts if r.max_new_tokens == GEN]
    assert {r.spec for r in timed} == {"off", "ngram"} and len(timed) == 3 * sum(len(q.turns) for q in QUESTIONS)
    assert timed[0].prompt_ids == turn_ids(local.tokenizer, QUESTIONS[0], [])

    before = len(runtime.log)
    again = run_endpoints(local.tokenizer, QUESTIONS, settings, local.name, endpoints, tmp_path, log=lambda _: None)
    assert again == rows and len(runtime.log) == before, "a finished endpoint ran again"
    assert len(load_results(tmp_path / RESULTS)) == len(QUESTIONS) * 4


def test_endpoints_alone_use_the_first_endpoints_answers_and_ids_prompts(served, tmp_path):
    runtime, server = served
    tok = FakeTokenizer()
    settings = SuiteSettings(methods=[], max_new_tokens=GEN)
    endpoints = [ep(server, "serve:greedy", speculative="off"), ep(server, "serve:ngram", speculative="ngram")]
    rows = run_endpoints(tok, QUESTIONS, settings, "fake-model", endpoints, tmp_path, prompt="ids", log=lambda _: None)
    assert all(r["lossless"] and r["prompt_source"] == "serve:greedy" and r["equals_off"] is None for r in rows)
    multi = next(q for q in QUESTIONS if len(q.turns) > 1)
    first = next(r for r in rows if r["question_id"] == multi.question_id)
    sent = [g.request.prompt_ids for g in runtime.log if g.request.max_new_tokens == GEN]
    assert turn_ids(tok, multi, first["texts"][:1]) in sent, "turn 2 carries the first endpoint's own answer"
    with pytest.raises(Exception, match="made with other prompts"):
        run_endpoints(tok, QUESTIONS, settings, "fake-model", endpoints, tmp_path, prompt="text", log=lambda _: None)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failing_endpoint_says_which_and_why(served, tmp_path):
    _, server = served
    dead = parse_endpoint(f"http://127.0.0.1:{closed_port()},dead:greedy")
    with pytest.raises(EndpointError, match=r"endpoint dead:greedy \(http://127\.0\.0\.1:\d+/v1\) could not be "
                                            r"reached.*is its server running"):
        EndpointClient(dead, timeout=5)
    with pytest.raises(EndpointError, match=r"serve:greedy .* answered POST /v1/completions with HTTP 404"):
        EndpointClient(ep(server, "serve:greedy", model="not-a-model")).complete("hi", 4)
    with pytest.raises(EndpointError, match="could not be reached"):
        run_endpoints(FakeTokenizer(), QUESTIONS, SuiteSettings(methods=[]), "fake-model", [dead], tmp_path,
                      log=lambda _: None)


def test_the_command_puts_every_system_in_one_table(served, tmp_path, monkeypatch, capsys):
    runtime, server = served
    fake_local_suite(monkeypatch)
    out = tmp_path / "out"
    argv = ["suite", "fake-model", "--categories", "code_edit,multi_turn", "--limit", "2", "--gen", str(GEN),
            "--methods", "off,ngram", "--llama-server", FAKE_LLAMA, "--llama-modes", "greedy,ngram-mod",
            "--endpoint", f"{server.url},serve:off,speculative=off",
            "--endpoint", f"{server.url},serve:ngram,speculative=ngram", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    table = (out / peers_table.FILE).read_text()
    for system in ("speczoo:off", "speczoo:ngram", "llama:greedy", "llama:ngram-mod", "serve:off", "serve:ngram"):
        assert f"| **overall** | {system} |" in table
        assert f"| code_edit | {system} |" in table
    overall = {line.split("|")[2].strip(): line.split("|") for line in table.splitlines() if "**overall**" in line}
    assert overall["llama:greedy"][5].strip() == "**1.00x**" and overall["llama:greedy"][6].strip() == "reference"
    assert overall["serve:ngram"][6].strip() == "4/4" and overall["serve:ngram"][7].strip() == "stream"
    assert overall["speczoo:ngram"][7].strip() == "engine" and overall["llama:ngram-mod"][7].strip() == "server"
    summary = (out / SUMMARY).read_text()
    assert "## Against llama-server" in summary and "## Servers by URL (streamed)" in summary
    assert "the same on every server" in summary and (out / "speedup.png").stat().st_size > 1000
    assert "| serve:ngram | fake-model | 4 |" in summary
    printed = capsys.readouterr().out
    assert "# Every system side by side" in printed

    only = tmp_path / "only"
    monkeypatch.setattr("speczoo.tokenizer.Tokenizer.from_bundle", classmethod(lambda cls, path: FakeTokenizer()))
    assert main(["suite", "fake-model", "--categories", "code_edit", "--limit", "1", "--gen", str(GEN), "--no-plot",
                 "--endpoint", f"{server.url},serve:off,speculative=off", "--endpoint",
                 f"{server.url},serve:ngram,speculative=ngram", "--out", str(only), "--no-progress"]) == 0
    summary = (only / SUMMARY).read_text()
    assert "## Speedup vs serve:off" in summary and "| code_edit | serve:off | 1 |" in summary
    assert {r["method"] for r in load_results(only / RESULTS)} == {"serve:off", "serve:ngram"}, "no local run"
    assert main(["suite", "fake-model", "--endpoint", f"{server.url},serve:ngram", "--out", str(only)]) == 2
    assert "has no greedy endpoint" in capsys.readouterr().err
    assert main(["suite", "fake-model", "--endpoint", server.url, "--llama-server", FAKE_LLAMA, "--out",
                 str(only)]) == 2
    assert "add --methods off" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.slow
def test_a_real_speczoo_serve_by_url(tmp_path):
    from speczoo.tokenizer import Tokenizer
    from speczoo.zoo.bundle import find_bundle

    port = closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "speczoo.cli", "serve", QWEN_NAME, "--port", str(port),
                             "--max-seq", "2048", "--parallel", "1", "--threads", "2", "--spec", "off"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"speczoo serve exited: {proc.stderr.read().decode()[-2000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "speczoo serve did not come up in 300 s"
            time.sleep(0.5)
        tok = Tokenizer.from_bundle(find_bundle(QWEN_NAME))
        questions = select(load_questions("builtin"), ["code_edit"], limit=1)
        url = f"http://127.0.0.1:{port}"
        endpoints = [parse_endpoint(f"{url},serve:off,speculative=off"),
                     parse_endpoint(f"{url},serve:ngram,speculative=ngram")]
        rows = run_endpoints(tok, questions, SuiteSettings(methods=[], max_new_tokens=32), QWEN_NAME, endpoints,
                             tmp_path, log=lambda _: None)
    finally:
        proc.terminate()
        proc.wait(30)
    greedy, ngram = rows
    assert greedy["tokens"] > 0 and greedy["texts"][0]
    assert ngram["lossless"], f"speczoo serve's ngram differs from its greedy at {ngram['first_mismatch']}"
    assert greedy["prompt_tokens"] == [len(turn_ids(tok, questions[0], []))], "the server read the text as we do"
    assert ngram["drafted"] > 0 and ngram["tok_s"] > 0 and ngram["tok_s_total"] > 0

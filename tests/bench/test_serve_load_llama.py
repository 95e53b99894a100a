"""llama.cpp's llama-server beside `speczoo serve-load` (`speczoo.bench.serve_load_llama`).

Fast tests run tests/fake_llama_server.py in its place (a subprocess speaking the OpenAI streaming
format); the `real` test runs the installed llama-server on the pulled 0.5B's GGUF with 2 clients.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fake_runtime import FakeRuntime
from real_models import QWEN_NAME, gguf_of, real_runtime
from speczoo.bench import serve_load_llama as L
from speczoo.bench.serve_load import LoadResult, StreamResult, run_serve_load

FAKE = str(Path(__file__).parents[1] / "fake_llama_server.py")


def bodies(n: int, max_tokens: int = 12) -> list[dict]:
    return [{"model": "m", "max_tokens": max_tokens, "temperature": 0, "speculative": "auto",
             "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(n)]


def comparison(**kw) -> L.LlamaComparison:
    return L.LlamaComparison(binary=FAKE, gguf=Path("/models/m.gguf"), parallel=kw.pop("parallel", 2),
                             slot_ctx=kw.pop("slot_ctx", 512), threads=3, alias="m", **kw)


def started(argv_file: Path) -> list[dict]:
    return [json.loads(line) for line in argv_file.read_text().splitlines()]


def pid_alive(pid: int) -> bool:
    """Whether `pid` still exists (a child that was waited for is gone, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_fake_server_serves_the_load_and_stops(tmp_path, monkeypatch):
    argv = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_ARGV", str(argv))
    cmp = comparison(parallel=4, slot_ctx=512)
    res = cmp.run(bodies(3))
    assert res.clients == 3 and res.tokens == 36 and [t.completion_tokens for t in res.together] == [12] * 3
    assert L.same_text(res.alone, res.together) == 3 and res.aggregate_tok_s == pytest.approx(36 / res.wall_seconds)
    assert all("speculative" not in b for b in res.bodies), "a speczoo-only field went to llama-server"
    [start] = started(argv)
    a = start["argv"]
    assert a[a.index("--parallel") + 1] == "4" and a[a.index("-c") + 1] == "2048"
    assert a[a.index("--threads") + 1] == "3" and a[a.index("-m") + 1] == "/models/m.gguf"
    assert "--jinja" in a and a[a.index("--host") + 1] == "127.0.0.1"
    assert not pid_alive(start["pid"]), "llama-server outlived its run"
    again = cmp.run(bodies(3))                       # solo answers are reused, not asked again
    assert again.alone == res.alone and len(started(argv)) == 2


def test_a_different_concurrent_answer_is_counted_and_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_DIVERGE", "1")
    llama = comparison().run(bodies(3))
    assert L.same_text(llama.alone, llama.together) < 3
    r = StreamResult(text="x", finish_reason="length", completion_tokens=12, first_token_s=0.1, seconds=1.0,
                     keepalives=0)
    ours = LoadResult(model="m", spec="auto", max_tokens=12, alone=[r] * 3, together=[r] * 3, wall_seconds=1.0)
    lines = L.comparison_lines([ours], llama)
    text = "\n".join(lines)
    assert f"LLAMA IDENTICAL {L.same_text(llama.alone, llama.together)}/3" in text
    assert "llama's solo answers equal speczoo's: 0/3" in text and "3/3 used their whole budget" in text
    assert lines[-1] == f"speczoo/llama aggregate: {36 / llama.aggregate_tok_s:.2f}x"
    assert lines[1].startswith("llama aggregate: 36 tokens") and lines[2].startswith("llama p50/p95:")


def test_a_server_that_dies_at_start_says_so_with_its_output(monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    with pytest.raises(RuntimeError, match="exited with status 3.*\n.*failed to load model"):
        comparison().run(bodies(1))


def test_the_server_is_stopped_when_the_block_raises(tmp_path, monkeypatch):
    argv = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_ARGV", str(argv))
    with pytest.raises(KeyboardInterrupt):
        with L.LlamaServer(FAKE, Path("m.gguf"), 1, 256, 1, "m"):
            raise KeyboardInterrupt
    assert not pid_alive(started(argv)[0]["pid"])


def test_finding_the_binary(tmp_path, monkeypatch):
    monkeypatch.delenv(L.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(L, "OPT_GLOB", str(tmp_path / "opt-*" / "llama-server"))
    assert L.find_llama_server() is None
    opt = tmp_path / "opt-avx2" / "llama-server"
    opt.parent.mkdir()
    opt.write_text("")
    assert L.find_llama_server() == str(opt)
    monkeypatch.setenv(L.ENV, FAKE)
    assert L.find_llama_server() == FAKE
    assert L.find_llama_server(str(opt)) == str(opt)
    with pytest.raises(FileNotFoundError, match="--llama-server /nowhere/llama-server"):
        L.find_llama_server("/nowhere/llama-server")


def test_the_command_prints_llamas_lines_after_speczoos(monkeypatch, capsys):
    import speczoo.runtime
    import speczoo.zoo.bundle
    from speczoo.cli import main

    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: FakeRuntime(answer_words=30))
    monkeypatch.setattr(speczoo.zoo.bundle, "find_bundle", lambda name: Path("/bundles") / name)
    monkeypatch.setattr(speczoo.zoo.bundle, "source_gguf", lambda d: Path("/models/fake.gguf"))
    assert main(["serve-load", "fake-model", "--clients", "1,2", "--max-tokens", "8", "--spec", "off",
                 "--llama-server", FAKE, "--llama-modes", "greedy"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("speczoo/llama aggregate: ") for line in out) == 2
    heads = [i for i, line in enumerate(out) if "concurrent streaming clients on fake-model" in line]
    assert out[heads[1] - 1].startswith("speczoo/llama aggregate: "), "llama's lines come after each run"
    assert out[-1].startswith("speczoo/llama aggregate: ")
    assert main(["serve-load", "fake-model", "--clients", "2", "--max-tokens", "4", "--spec", "off,ngram",
                 "--llama-server", FAKE, "--llama-modes", "greedy"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (spec ")[1] for line in out[-2:]] == ["off)", "ngram)"], "one ratio per --spec mode"
    assert sum("LLAMA IDENTICAL" in line for line in out) == 1, "llama runs once per client count"
    assert main(["serve-load", "fake-model", "--clients", "1", "--max-tokens", "4", "--llama-server", "off"]) == 0
    assert "llama" not in capsys.readouterr().out


def test_the_command_runs_every_llama_mode_by_default_each_judged_against_llama_greedy(tmp_path, monkeypatch,
                                                                                      capsys):
    import speczoo.runtime
    import speczoo.zoo.bundle
    from speczoo.cli import main

    argv = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_ARGV", str(argv))
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: FakeRuntime(answer_words=30))
    monkeypatch.setattr(speczoo.zoo.bundle, "find_bundle", lambda name: Path("/bundles") / name)
    monkeypatch.setattr(speczoo.zoo.bundle, "source_gguf", lambda d: Path(f"/models/{d.name}.gguf"))
    assert main(["serve-load", "fake-model", "--clients", "2", "--max-tokens", "4", "--spec", "off",
                 "--draft", "fake-draft", "--llama-server", FAKE]) == 0
    out = capsys.readouterr().out
    modes = ("ngram-mod", "ngram-simple", "draft")
    for mode in modes:
        assert f"llama-server {mode} --parallel 1: LLAMA {mode.upper()} IDENTICAL 2/2" in out
        assert f"speczoo/llama {mode} aggregate: " in out
    assert out.count("EQUALS LLAMA GREEDY 2/2") == 3
    spec_types = [a[a.index("--spec-type") + 1] if "--spec-type" in a else None for a in
                  (start["argv"] for start in started(argv))]
    assert spec_types == [None, "ngram-mod", "ngram-simple", "draft-simple"], "one fresh server per mode, greedy first"
    draft = started(argv)[-1]["argv"]
    assert draft[draft.index("-md") + 1] == "/models/fake-draft.gguf"
    assert main(["serve-load", "fake-model", "--clients", "1", "--llama-server", FAKE, "--llama-modes", "ngram-mod"]) == 2
    assert "must include greedy" in capsys.readouterr().err


def test_the_command_says_when_there_is_no_llama_server(tmp_path, monkeypatch, capsys):
    import speczoo.runtime
    from speczoo.cli import main

    monkeypatch.delenv(L.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(L, "OPT_GLOB", str(tmp_path / "none-*"))
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: FakeRuntime(answer_words=30))
    assert main(["serve-load", "fake-model", "--clients", "1", "--max-tokens", "4", "--spec", "off"]) == 0
    out = capsys.readouterr().out
    assert "llama-server: none found" in out and "speczoo/llama" not in out


@pytest.mark.real
def test_llama_server_on_the_real_05b():
    binary = L.find_llama_server()
    if binary is None:
        pytest.skip("no llama-server installed ($SPECZOO_LLAMA_SERVER, PATH, /opt/llama-server-*/bin)")
    ours = run_serve_load(real_runtime(max_seq=1024), clients=2, max_tokens=12, spec="auto", parallel=2)
    cmp = L.LlamaComparison(binary=binary, gguf=gguf_of(QWEN_NAME), parallel=2, slot_ctx=1024,
                            threads=torch.get_num_threads(), alias=QWEN_NAME)   # speczoo's threads
    llama = cmp.run(ours.bodies)
    print("\n".join(ours.lines() + L.comparison_lines([ours], llama)))
    assert llama.clients == 2 and all(t.completion_tokens > 0 for t in llama.together + llama.alone)
    assert all(t.text for t in llama.alone), "llama-server answered with no text"
    assert llama.aggregate_tok_s > 0

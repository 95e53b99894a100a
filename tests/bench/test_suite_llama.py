"""llama-server's modes beside the suite: command lines, the same prompt ids, rows, resumption, the table.

The fast tests run tests/fake_llama_server.py in llama-server's place on a fake runtime; the `real` test
runs the installed llama-server on the pulled 0.5B's GGUF."""

import json
from pathlib import Path

import pytest

from fake_runtime import FakeRuntime, fake_local_suite
from real_models import QWEN_NAME, gguf_of, real_runtime
from speczoo.bench import suite_llama as SL
from speczoo.bench.llama_completion import completion_body
from speczoo.bench.llama_modes import DRAFT_N_MAX, parse_modes
from speczoo.bench.agentic import agentic_questions
from speczoo.bench.questions import select
from speczoo.bench.serve_load_llama import LlamaServer, find_llama_server
from speczoo.bench.suite import RESULTS, SUMMARY, SuiteSettings, load_results, run_suite, turn_ids
from speczoo.cli import main

FAKE = str(Path(__file__).parents[1] / "fake_llama_server.py")
GEN = 12


def settings(modes=("greedy", "ngram-mod", "draft"), binary=FAKE) -> SL.LlamaSuiteSettings:
    return SL.LlamaSuiteSettings(binary=binary, gguf=Path("/models/t.gguf"), threads=3, modes=list(modes),
                                 draft_gguf=Path("/models/d.gguf"))


def test_modes_are_checked_and_greedy_comes_first():
    assert parse_modes("ngram-simple,ngram-mod,greedy", has_draft=False) == ["greedy", "ngram-simple", "ngram-mod"]
    with pytest.raises(ValueError, match="must include greedy"):
        parse_modes("ngram-mod", has_draft=True)
    with pytest.raises(ValueError, match="unknown"):
        parse_modes("greedy,lookup", has_draft=True)
    with pytest.raises(ValueError, match="needs a draft model"):
        parse_modes("greedy,draft", has_draft=False)


def test_each_mode_starts_llama_server_with_its_flags():
    s = settings()

    def argv(mode):
        return LlamaServer(s.binary, s.gguf, parallel=1, slot_ctx=4096, threads=s.threads, alias="t",
                           extra_args=tuple(s.args(mode))).command()

    plain = argv("greedy")
    assert "--spec-type" not in plain and "-md" not in plain
    assert plain[plain.index("-m") + 1] == "/models/t.gguf" and plain[plain.index("--threads") + 1] == "3"
    assert plain[plain.index("-c") + 1] == "4096" and plain[plain.index("--parallel") + 1] == "1"
    ngram = argv("ngram-mod")
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "-md" not in ngram
    simple = argv("ngram-simple")
    assert simple[simple.index("--spec-type") + 1] == "ngram-simple" and "--spec-draft-n-max" not in simple
    draft = argv("draft")
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("-md") + 1] == "/models/d.gguf"
    assert draft[draft.index("--spec-draft-n-max") + 1] == str(DRAFT_N_MAX) == "7"   # llama.cpp's recipe
    assert draft[draft.index("-td") + 1] == "3" and draft[draft.index("-tbd") + 1] == "3"
    body = completion_body([1, 2, 3], 7)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 7 and body["top_k"] == 1
    assert body["temperature"] == 0 and body["return_tokens"] is True


def test_an_answer_that_stopped_at_eos_loses_its_eos_token():
    from speczoo.bench.suite import Conversation

    conv = Conversation()
    timings = {"predicted_n": 4, "predicted_ms": 40.0, "prompt_ms": 5.0, "draft_n": 6, "draft_n_accepted": 2}
    SL.add_answer(conv, {"content": "abc", "tokens": [1, 2, 3, 99], "stop_type": "eos", "timings": timings}, [99])
    SL.add_answer(conv, {"content": "abc", "tokens": [1, 2, 3, 99], "stop_type": "limit", "timings": timings}, [99])
    assert conv.ids == [[1, 2, 3], [1, 2, 3, 99]] and conv.tokens == 7 and conv.finish == ["stop", "length"]
    assert conv.seconds == pytest.approx(0.08) and conv.drafted == 12 and conv.accepted == 4


def fake_answer(ids: list[int], n: int) -> list[int]:
    """What tests/fake_llama_server.py answers to prompt ids."""
    return [100 + (sum(ids) + 7 * i) % 50 for i in range(n)]


def test_the_agentic_suite_end_to_end_with_llama_servers_modes(tmp_path, monkeypatch):
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_ARGV", str(argv_log))
    runtime = FakeRuntime(max_seq=100_000)
    questions = select(agentic_questions(), limit=1)
    suite = SuiteSettings(methods=["off", "ngram"], max_new_tokens=GEN)
    outcome = run_suite(runtime, questions, suite, tmp_path, progress=False, plot=False)
    assert all(r["lossless"] for r in outcome.rows) and len(outcome.rows) == 6
    rows = SL.run_llama_modes(runtime.tokenizer, questions, suite, runtime.name, settings(), tmp_path,
                              log=lambda _: None)
    assert [r["method"] for r in rows] == [f"llama:{m}" for m in ("greedy", "ngram-mod", "draft") for _ in questions]
    off = {r["question_id"]: r for r in outcome.rows if r["method"] == "off"}
    for r in rows:
        q = next(q for q in questions if q.question_id == r["question_id"])
        # turn t was fed the ids speczoo's off was fed: its own earlier answers as the assistant turns
        assert r["ids"] == [fake_answer(turn_ids(runtime.tokenizer, q, off[q.question_id]["texts"][:t]), GEN)
                            for t in range(len(q.turns))]
        assert r["lossless"] and not r["equals_off"] and r["reference"] == "llama:greedy"
        assert r["tokens"] == GEN * len(q.turns)
    assert [r["drafted"] > 0 for r in rows] == [False] * 3 + [True] * 6
    starts = [json.loads(line)["argv"] for line in argv_log.read_text().splitlines()]
    assert len(starts) == 3 and starts[1][starts[1].index("--spec-type") + 1] == "ngram-mod"

    again = SL.run_llama_modes(runtime.tokenizer, questions, suite, runtime.name, settings(), tmp_path,
                               log=lambda _: None)
    assert again == rows and len(argv_log.read_text().splitlines()) == 3, "a finished mode ran again"
    assert len(load_results(tmp_path / RESULTS)) == 6 + 9

    from speczoo.bench import report
    summary = report.summarize(outcome.rows + rows)
    table = SL.render_versus(summary, outcome.rows + rows)
    assert "| llama:ngram-mod |" in table and "| off |" in table
    greedy = next(x for x in table.splitlines() if x.startswith("| llama:greedy |")).split("|")
    assert greedy[4].strip() == "0.50x" and greedy[5].strip() == "reference"   # the fake drafts at twice the speed


def test_llama_modes_need_speczoos_off_answers_first(tmp_path):
    questions = select(agentic_questions(), limit=1)
    with pytest.raises(Exception, match="run the suite with off first"):
        SL.run_llama_modes(FakeRuntime().tokenizer, questions, SuiteSettings(methods=["off"]), "m", settings(),
                           tmp_path, log=lambda _: None)


def test_cli_suite_agentic_with_llama_server(tmp_path, monkeypatch, capsys):
    fake_local_suite(monkeypatch)
    out = tmp_path / "out"
    assert main(["suite", "qwen2.5-coder-1.5b", "--questions", "agentic", "--limit", "1", "--methods", "off,ngram",
                 "--gen", str(GEN), "--llama-server", FAKE, "--llama-modes", "greedy,ngram-mod", "--out", str(out),
                 "--no-progress", "--no-plot"]) == 0
    methods = [r["method"] for r in load_results(out / RESULTS)]
    assert methods.count("llama:ngram-mod") == 3 and methods.count("off") == 3
    text = (out / SUMMARY).read_text()
    assert "## Against llama-server" in text and "agentic_tools" in text
    assert "| llama:greedy |" in capsys.readouterr().out


def test_interleave_runs_each_category_on_both_before_the_next(tmp_path, monkeypatch, capsys):
    """--interleave: a category's speczoo rows, then its llama-server rows, then the next category's, so
    a machine that slows down over the run slows both alike; the reports are those of a run in two blocks."""
    fake_local_suite(monkeypatch)
    argv = ["suite", "qwen2.5-coder-1.5b", "--questions", "agentic", "--limit", "1", "--methods", "off,ngram",
            "--gen", str(GEN), "--llama-server", FAKE, "--llama-modes", "greedy,ngram-mod", "--no-progress",
            "--no-plot"]
    out = tmp_path / "out"
    assert main(argv + ["--interleave", "--out", str(out)]) == 0
    rows = load_results(out / RESULTS)
    cats = [r["category"] for r in rows]
    assert cats == sorted(cats, key=cats.index)                         # one category after the other
    first = [r["method"] for r in rows if r["category"] == cats[0]]
    assert first == ["off", "ngram", "llama:greedy", "llama:ngram-mod"]
    assert "6 rows generated by speczoo here" in capsys.readouterr().out      # every row it made counted
    blocks = tmp_path / "blocks"
    assert main(argv + ["--out", str(blocks)]) == 0
    assert [r["method"] for r in load_results(blocks / RESULTS)][:3] == ["off", "ngram", "off"]
    strip = lambda rs: sorted((r["question_id"], r["method"], r["ids"]) for r in rs)
    assert strip(rows) == strip(load_results(blocks / RESULTS))       # the same rows, in another order
    capsys.readouterr()
    assert main(["suite", "qwen2.5-coder-1.5b", "--interleave", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "give --llama-server" in capsys.readouterr().err


def test_interleave_by_question_runs_each_question_on_both_before_the_next(tmp_path, monkeypatch, capsys):
    """--interleave question: a question's speczoo rows, then its llama-server rows, then the next question's
    (two of a category here, so the order differs from --interleave's); the same rows as a run in two blocks."""
    fake_local_suite(monkeypatch)
    argv = ["suite", "qwen2.5-coder-1.5b", "--questions", "agentic", "--limit", "2", "--categories", "agentic_tools",
            "--methods", "off,ngram", "--gen", str(GEN), "--llama-server", FAKE, "--llama-modes", "greedy,ngram-mod",
            "--no-progress", "--no-plot"]
    out = tmp_path / "out"
    assert main(argv + ["--interleave", "question", "--out", str(out)]) == 0
    rows = load_results(out / RESULTS)
    per_question = ["off", "ngram", "llama:greedy", "llama:ngram-mod"]
    assert [r["method"] for r in rows] == per_question * 2
    assert rows[0]["question_id"] == rows[3]["question_id"] != rows[4]["question_id"]
    assert "4 rows generated by speczoo here" in capsys.readouterr().out
    blocks = tmp_path / "blocks"
    assert main(argv + ["--out", str(blocks)]) == 0
    strip = lambda rs: sorted((r["question_id"], r["method"], r["ids"]) for r in rs)
    assert strip(rows) == strip(load_results(blocks / RESULTS))


@pytest.mark.real
def test_llama_server_beside_the_suite_on_the_real_05b(tmp_path):
    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server installed ($SPECZOO_LLAMA_SERVER, PATH, /opt/llama-server-*/bin; "
                    "bash benchmarks/build_llama.sh builds one)")
    runtime = real_runtime(max_seq=4096)
    questions = [q for q in agentic_questions() if q.category == "agentic_edit"][:1]
    suite = SuiteSettings(methods=["off", "ngram"], max_new_tokens=16)
    outcome = run_suite(runtime, questions, suite, tmp_path, progress=False, plot=False)
    assert all(r["lossless"] for r in outcome.rows)
    llama = SL.LlamaSuiteSettings(binary=binary, gguf=gguf_of(QWEN_NAME), threads=2,
                                  modes=["greedy", "ngram-mod"])
    rows = SL.run_llama_modes(runtime.tokenizer, questions, suite, runtime.name, llama, tmp_path,
                              log=lambda _: None)
    assert [r["method"] for r in rows] == ["llama:greedy", "llama:ngram-mod"]
    assert all(len(ids) > 0 for r in rows for ids in r["ids"])
    assert rows[1]["lossless"], f"llama's ngram-mod differs from its greedy at {rows[1]['first_mismatch']}"

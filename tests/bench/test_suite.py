"""The suite runner (on a fake runtime), its resumption, and the summary arithmetic."""

import json
import math
import sys
import types

import pytest

from speczoo.bench import report
from question_files import write_questions
from speczoo.bench.questions import Question
from speczoo.bench.suite import (
    RESULTS, SUMMARY, SuiteSettings, first_mismatch, load_results, parse_methods, run_suite)
from speczoo.cli import main
from speczoo.errors import SpeczooError
from speczoo.events import DoneEvent, Stats, TokenEvent

GEN = 30


class FakeTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class FakeRuntime:
    """Deterministic answers that depend on the whole prompt; fake timings per method.

    off: 1 token a round, 0.01 s a round (100 tok/s). ngram: 3 tokens a round (drafted 4, accepted 2),
    0.012 s a round (250 tok/s: speedup 2.5). broken: like ngram but its last token is wrong.
    """

    name = "fake-target"
    target = types.SimpleNamespace(backend="fake-backend")

    def __init__(self, interrupt_after=None):
        self.tokenizer = FakeTokenizer()
        self.calls = []
        self.interrupt_after = interrupt_after

    def generate(self, request):
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append(request)
        seed = sum(request.prompt_ids) % 997
        ids = self.tokenizer.encode((f"answer {seed} " * GEN)[:request.max_new_tokens])
        if request.spec == "broken":
            ids[-1] += 1
        step, seconds, drafted, accepted = (1, 0.01, 0, 0) if request.spec == "off" else (3, 0.012, 4, 2)
        rounds = 0
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            rounds += 1
            yield TokenEvent(ids=chunk, text=self.tokenizer.decode(chunk), drafted=drafted,
                             accepted=accepted)
        stats = Stats(prompt_tokens=len(request.prompt_ids), new_tokens=len(ids),
                      seconds=rounds * seconds, rounds=rounds, drafted=rounds * drafted,
                      accepted=rounds * accepted, drafter=request.spec)
        yield DoneEvent(finish_reason="length", text=self.tokenizer.decode(ids), ids=ids, stats=stats)


QUESTIONS = [
    Question(1, "rag", ["Where is the key?"]),
    Question(2, "rag", ["Which line says so?"]),
    Question(3, "math", ["2+2?"]),
    Question(4, "multi_turn", ["Say hi.", "Now say bye.", "And again."]),
]
SETTINGS = SuiteSettings(methods=["off", "ngram", "broken"], max_new_tokens=GEN, k=4, ngram=3)


def read_rows(out):
    return [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]


def test_suite_rows_lossless_and_multi_turn(tmp_path):
    rt = FakeRuntime()
    outcome = run_suite(rt, QUESTIONS, SETTINGS, tmp_path, progress=False)
    rows = read_rows(tmp_path)
    assert [(r["question_id"], r["method"]) for r in rows] == [
        (q.question_id, m) for q in QUESTIONS for m in ("off", "ngram", "broken")]
    by = {(r["question_id"], r["method"]): r for r in rows}
    for q in QUESTIONS:
        off, ngram, broken = (by[(q.question_id, m)] for m in ("off", "ngram", "broken"))
        assert off["lossless"] and ngram["lossless"] and not broken["lossless"]
        assert broken["first_mismatch"] == [0, GEN - 1]
        assert ngram["ids_sha256"] == off["ids_sha256"] != broken["ids_sha256"]
        assert off["tokens"] == GEN * len(q.turns) and off["rounds"] == GEN * len(q.turns)
        assert ngram["accepted_per_round"] == 2.0 and ngram["tok_s"] == pytest.approx(250)
        assert ngram["acceptance_by_position"] == [1.0, 1.0, 0.0, 0.0]
        assert off["pos_drafted"] == [0, 0, 0, 0]
        assert off["by_drafter"] == {"none": {"rounds": off["rounds"], "drafted": 0, "accepted": 0}}
        assert sum(d["rounds"] for d in ngram["by_drafter"].values()) == ngram["rounds"]
        assert sum(d["accepted"] for d in ngram["by_drafter"].values()) == ngram["accepted"]
    # multi-turn: every turn goes through the chat template with the model's earlier answers
    multi = [r for r in rt.calls if rt.tokenizer.decode(r.prompt_ids).startswith("<user>Say hi.")]
    assert len(multi) == 3 * 3
    turn3 = rt.tokenizer.decode(multi[2].prompt_ids)
    answers = by[(4, "off")]["texts"]
    assert len(answers) == 3
    assert turn3 == (f"<user>Say hi.</user><assistant>{answers[0]}</assistant>"
                     f"<user>Now say bye.</user><assistant>{answers[1]}</assistant>"
                     "<user>And again.</user><assistant>")
    assert outcome.ran == 12 and outcome.skipped == 0
    summary = (tmp_path / SUMMARY).read_text()
    assert "| **overall** | **1.00x** | **2.50x** | **2.50x** |" in summary
    assert "| rag | ngram | 2 |" in summary and "| 0/2 |" in summary
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_off_runs_first_for_each_question(tmp_path):
    rt = FakeRuntime()
    run_suite(rt, QUESTIONS[:2], SuiteSettings(methods=["ngram", "off"], max_new_tokens=GEN), tmp_path,
              progress=False, plot=False)
    assert [r.spec for r in rt.calls] == ["off", "ngram", "off", "ngram"]
    with pytest.raises(ValueError, match="must include off"):
        parse_methods("ngram,auto")


def test_each_method_drafts_from_its_own_memory_only(tmp_path):
    """Every method answers the same turns, so each gets its own suffix-memory tenant: a later method must
    never draft from an earlier method's identical answers (a free, unreal speedup)."""
    rt = FakeRuntime()
    run_suite(rt, QUESTIONS, SETTINGS, tmp_path, progress=False, plot=False)
    tenants = {r.spec: {c.tenant for c in rt.calls if c.spec == r.spec} for r in rt.calls}
    assert all(len(t) == 1 for t in tenants.values())                 # one tenant a method, every turn
    assert len({t.pop() for t in tenants.values()}) == len(SETTINGS.methods)   # and none shared


@pytest.mark.parametrize("interrupt_after", [1, 5, 7])
def test_resume_after_interrupt(tmp_path, interrupt_after):
    fresh = tmp_path / "fresh"
    run_suite(FakeRuntime(), QUESTIONS, SETTINGS, fresh, progress=False, plot=False)

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_suite(FakeRuntime(interrupt_after=interrupt_after), QUESTIONS, SETTINGS, out,
                  progress=False, plot=False)
    partial = read_rows(out)
    assert 0 < len(partial) < 12
    # simulate a kill in the middle of writing the next row: half a line, no newline
    with open(out / RESULTS, "a") as f:
        f.write('{"question_id": 99, "categ')
    rt2 = FakeRuntime()
    outcome = run_suite(rt2, QUESTIONS, SETTINGS, out, progress=False, plot=False)
    rows = read_rows(out)
    keys = [(r["question_id"], r["method"]) for r in rows]
    assert len(keys) == len(set(keys)) == 12                    # no duplicates, nothing lost
    assert rows[:len(partial)] == partial                       # old rows untouched
    assert outcome.skipped == len(partial) and outcome.ran == 12 - len(partial)
    turns = {q.question_id: len(q.turns) for q in QUESTIONS}
    assert len(rt2.calls) == sum(turns[q] for q, _ in keys[len(partial):])   # only the missing rows ran
    assert (out / SUMMARY).read_text() == (fresh / SUMMARY).read_text()
    strip = lambda rs: sorted(json.dumps(r, sort_keys=True) for r in rs)  # noqa: E731
    assert strip(rows) == strip(read_rows(fresh))               # lossless computed from off read back

    # a complete rerun generates nothing
    rt3 = FakeRuntime()
    assert run_suite(rt3, QUESTIONS, SETTINGS, out, progress=False, plot=False).ran == 0
    assert rt3.calls == []


def test_resume_refuses_other_settings_and_bad_rows(tmp_path):
    run_suite(FakeRuntime(), QUESTIONS[:1], SETTINGS, tmp_path, progress=False, plot=False)
    other = SuiteSettings(methods=SETTINGS.methods, max_new_tokens=GEN - 1, k=4, ngram=3)
    with pytest.raises(SpeczooError, match="max_new_tokens"):
        run_suite(FakeRuntime(), QUESTIONS[:1], other, tmp_path, progress=False, plot=False)
    other = SuiteSettings(methods=SETTINGS.methods, max_new_tokens=GEN, k=4, ngram=3, backend="q8")
    with pytest.raises(SpeczooError, match="backend"):
        run_suite(FakeRuntime(), QUESTIONS[:1], other, tmp_path, progress=False, plot=False)
    changed = [Question(1, "rag", ["a different prompt"])]
    with pytest.raises(SpeczooError, match="different turns"):
        run_suite(FakeRuntime(), changed, SETTINGS, tmp_path, progress=False, plot=False)
    lines = (tmp_path / RESULTS).read_text().splitlines()
    (tmp_path / RESULTS).write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")
    with pytest.raises(SpeczooError, match=r"results.jsonl:2"):
        load_results(tmp_path / RESULTS)


def test_first_mismatch():
    assert first_mismatch([[1, 2], [3]], [[1, 2], [3]]) is None
    assert first_mismatch([[1, 2], [3]], [[1, 2], [4]]) == [1, 0]
    assert first_mismatch([[1, 2]], [[1, 2, 5]]) == [0, 2]
    assert first_mismatch([[1], [2]], [[1]]) == [1, 0]


def row(q, cat, method, tokens, seconds, rounds, accepted, lossless=True, pd=(), pa=()):
    return {"question_id": q, "category": cat, "method": method, "tokens": tokens, "seconds": seconds,
            "rounds": rounds, "accepted": accepted, "lossless": lossless,
            "pos_drafted": list(pd), "pos_accepted": list(pa)}


FIXED = [
    row(1, "code", "off", 100, 10.0, 100, 0), row(1, "code", "ngram", 100, 4.0, 40, 60, True, (40, 30), (30, 20)),
    row(2, "code", "off", 50, 5.0, 50, 0), row(2, "code", "ngram", 50, 1.0, 20, 30, False, (20,), (10,)),
    row(3, "chat", "off", 80, 8.0, 80, 0), row(3, "chat", "ngram", 80, 10.0, 75, 5, True, (10, 5), (5, 0)),
    row(4, "chat", "ngram", 999, 1.0, 1, 0),   # no off row for q4: left out of the paired speedup
]


def test_summary_arithmetic_on_fixed_rows():
    s = report.summarize(FIXED)
    assert [c.category for c in s.categories] == ["code", "chat"]
    code = s.method("ngram", "code")
    # code: off 150 tok / 15 s = 10 tok/s; ngram 150 tok / 5 s = 30 tok/s → 3x
    assert code.tok_s == pytest.approx(30.0) and code.speedup == pytest.approx(3.0)
    assert code.accepted_per_round == pytest.approx(90 / 60)
    assert code.lossless == 1 and code.questions == 2
    assert code.acceptance_by_position == [pytest.approx(40 / 60), pytest.approx(20 / 30)]
    chat = s.method("ngram", "chat")
    # chat, paired on q3 only: off 10 tok/s, ngram 8 tok/s → 0.8x; tok/s itself uses both rows
    assert chat.speedup == pytest.approx(0.8)
    assert chat.tok_s == pytest.approx((80 + 999) / 11.0)
    overall = s.method("ngram")
    assert overall.speedup == pytest.approx(math.sqrt(3.0 * 0.8))       # geometric mean of categories
    assert overall.tok_s == pytest.approx((100 + 50 + 80 + 999) / 16.0)
    assert overall.accepted_per_round == pytest.approx(95 / 136)
    assert overall.lossless == 3 and overall.questions == 4
    assert s.method("off").speedup == pytest.approx(1.0)
    assert s.method("off").tok_s == pytest.approx(230 / 23.0)
    md = report.render_markdown(s)
    assert "| code | 1.00x | 3.00x |" in md and "| chat | 1.00x | 0.80x |" in md
    assert "| **overall** | **1.00x** | **1.55x** |" in md
    assert "| code | off | 2 | 150 | 10.00 | 1.00x | 0.00 | reference |" in md
    assert "| code | ngram | 2 | 150 | 30.00 | 3.00x | 1.50 | 1/2 |" in md


def test_geomean_and_no_off():
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(report.geomean([]))
    s = report.summarize([row(1, "x", "ngram", 10, 1.0, 5, 5)])
    assert s.method("ngram").speedup is None
    assert "—" in report.render_markdown(s)


def test_cli_suite(tmp_path, monkeypatch, capsys):
    qfile = tmp_path / "q.jsonl"
    write_questions(qfile, QUESTIONS)
    seen = {}

    def load_runtime(target, draft=None, backend=None, max_seq=4096, eagle_head=None):
        seen.update(target=target, draft=draft, max_seq=max_seq, eagle_head=eagle_head)
        return FakeRuntime()

    fake = types.ModuleType("speczoo.runtime")
    fake.load_runtime = load_runtime
    monkeypatch.setitem(sys.modules, "speczoo.runtime", fake)
    out = tmp_path / "out"
    argv = ["suite", "fake-target", "--questions", str(qfile), "--methods", "off,draft:tiny",
            "--gen", str(GEN), "--limit", "1", "--categories", "rag,math", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    assert seen == {"target": "fake-target", "draft": "tiny", "max_seq": 4096, "eagle_head": None}
    rows = read_rows(out)
    assert [(r["question_id"], r["method"]) for r in rows] == [
        (1, "off"), (1, "draft:tiny"), (3, "off"), (3, "draft:tiny")]
    assert {r["backend"] for r in rows} == {"fake-backend"}
    assert "Speedup vs off" in capsys.readouterr().out
    assert main(argv[:4] + ["--methods", "ngram", "--out", str(out)]) == 2
    assert "must include off" in capsys.readouterr().err


def test_suite_loads_the_zoos_draft_for_draft_and_auto_methods():
    from speczoo.commands.suite import draft_to_load

    target = "qwen2.5-coder-1.5b"
    assert draft_to_load(target, ["off", "ngram"], None) is None
    assert draft_to_load(target, ["off", "auto"], None) == "qwen2.5-coder-0.5b"
    assert draft_to_load(target, ["off", "draft"], None) == "qwen2.5-coder-0.5b"
    assert draft_to_load(target, ["off", "draft:other"], None) == "other"
    assert draft_to_load(target, ["off", "auto"], "other") == "other"
    with pytest.raises(ValueError, match="different drafts"):
        draft_to_load(target, ["off", "draft:a"], "b")
    with pytest.raises(ValueError, match="one draft model"):
        draft_to_load(target, ["off", "draft:a", "draft:b"], None)


def test_suite_loads_the_one_head_its_methods_name():
    """A runtime resolves its EAGLE head once, at load: the head of eagle:NAME methods, one at most."""
    from speczoo.commands.suite import head_to_load

    assert head_to_load(["off", "auto", "eagle"]) is None                  # the newest installed, if any
    assert head_to_load(["off", "eagle:h-eagle", "eagle-tree:h-eagle"]) == "h-eagle"
    with pytest.raises(ValueError, match="one EAGLE head"):
        head_to_load(["off", "eagle:a-eagle", "eagle:b-eagle"])

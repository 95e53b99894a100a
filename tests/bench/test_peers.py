"""`speczoo peers`: row and summary arithmetic, the lossless judgement, missing peers, the llama.cpp
families against fakes, speczoo's family on the fake runtime, and (real) a tiny run through each peer."""

import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import pytest

from fake_runtime import FakeRuntime
from speczoo.bench import peers
from speczoo.bench.peers import (
    PeerOutput, PeerError, PeerPrompt, PeerSettings, SpeczooFamily, cut_at_eos, judge, make_row,
    parse_systems, run_peers, timed_tokens)
from speczoo.bench.peers_summary import render_markdown, summarize
from speczoo.bench.peers_llama import BUILD_HINT, LlamaCliFamily, LlamaCppFamily, parse_tool_output

EOS = 256


def settings(**kw):
    base = dict(target="fake-target", target_gguf=Path("/models/target.gguf"), eos_ids=[EOS],
                draft="fake-draft", draft_gguf=Path("/models/draft.gguf"), max_new_tokens=12, threads=2, k=4,
                n_ctx=256, warmup=0)
    base.update(kw)
    return PeerSettings(**base)


PROMPTS = [PeerPrompt(1, "code_edit", "<u>rename x</u><a>", [60, 117, 62, 1, 2, 3]),
           PeerPrompt(2, "writing", "<u>a story</u><a>", [60, 117, 62, 9, 8]),
           PeerPrompt(3, "writing", "<u>a poem</u><a>", [99, 117, 62, 7])]


# -- arithmetic --------------------------------------------------------------------------------------

def test_timed_tokens_counts_decode_steps_after_the_prefill_token():
    assert timed_tokens(96, "length") == 95      # 96 tokens: the first came from the prefill
    assert timed_tokens(10, "stop") == 10        # 10 tokens + the EOS step, minus the prefill token
    assert timed_tokens(0, "stop") == 0          # EOS straight out of the prefill: nothing timed
    assert timed_tokens(1, "length") == 0


def test_cut_at_eos():
    assert cut_at_eos([5, 6, EOS, 7], [EOS]) == ([5, 6], "stop")
    assert cut_at_eos([5, 6, 7], [EOS, 300]) == ([5, 6, 7], "length")
    assert cut_at_eos([300], [EOS, 300]) == ([], "stop")


def _row(qid, cat, system, tokens, seconds, lossless=None, reference=None):
    return {"question_id": qid, "category": cat, "system": system, "describe": system, "new_tokens": tokens + 1,
            "tokens": tokens, "seconds": seconds, "lossless": lossless, "reference": reference,
            "timing": "first-token"}


ROWS = [
    # code_edit: baseline 100 tok/s, hf:lookup 50 tok/s (0.5x), speczoo:off 25, speczoo:ngram 200 (8x off)
    _row(1, "code_edit", "llama:greedy", 100, 1.0),
    _row(1, "code_edit", "hf:greedy", 10, 1.0),
    _row(1, "code_edit", "hf:lookup", 50, 1.0, lossless=False, reference="hf:greedy"),
    _row(1, "code_edit", "speczoo:off", 25, 1.0),
    _row(1, "code_edit", "speczoo:ngram", 200, 1.0, lossless=True, reference="speczoo:off"),
    # writing (2 questions): baseline Σ200/Σ4 = 50 tok/s; hf:lookup Σ100/Σ4 = 25 (0.5x);
    # speczoo:ngram Σ100/Σ1 = 100 (2x), one answer lossless of two
    _row(2, "writing", "llama:greedy", 100, 2.0),
    _row(3, "writing", "llama:greedy", 100, 2.0),
    _row(2, "writing", "hf:lookup", 50, 2.0, lossless=True, reference="hf:greedy"),
    _row(3, "writing", "hf:lookup", 50, 2.0, lossless=True, reference="hf:greedy"),
    _row(2, "writing", "speczoo:ngram", 50, 0.5, lossless=True, reference="speczoo:off"),
    _row(3, "writing", "speczoo:ngram", 50, 0.5, lossless=False, reference="speczoo:off"),
]


def test_summary_ratios_are_paired_per_category_and_geometric_overall():
    s = summarize(ROWS, ["code_edit", "writing"])
    assert s.system("hf:lookup", "code_edit").ratio == pytest.approx(0.5)
    assert s.system("hf:lookup", "writing").ratio == pytest.approx(0.5)
    assert s.system("speczoo:ngram", "code_edit").ratio == pytest.approx(2.0)
    assert s.system("speczoo:ngram", "writing").ratio == pytest.approx(2.0)
    assert s.system("speczoo:ngram").ratio == pytest.approx(2.0)
    assert s.system("hf:lookup").ratio == pytest.approx(0.5)
    assert s.system("llama:greedy").ratio == pytest.approx(1.0)
    # speczoo:off ran only in code_edit: 25/100; overall = that one category's ratio
    assert s.system("speczoo:off").ratio == pytest.approx(0.25)
    # overall tok/s pools tokens and seconds: llama Σ300/Σ5
    assert s.system("llama:greedy").tok_s == pytest.approx(60.0)
    ngram = s.system("speczoo:ngram")
    assert (ngram.lossless, ngram.judged, ngram.is_reference) == (2, 3, False)
    assert s.system("hf:lookup", "writing").lossless == 2
    assert s.system("llama:greedy").is_reference


def test_summary_geomean_over_unequal_categories():
    rows = [_row(1, "a", "llama:greedy", 10, 1.0), _row(1, "a", "x", 40, 1.0, True, "y"),
            _row(2, "b", "llama:greedy", 10, 1.0), _row(2, "b", "x", 10, 1.0, True, "y")]
    assert summarize(rows).system("x").ratio == pytest.approx(math.sqrt(4.0 * 1.0))


def test_summary_without_baseline_has_no_ratios_and_says_so_in_markdown():
    rows = [r for r in ROWS if r["system"] != "llama:greedy"]
    s = summarize(rows)
    assert all(x.ratio is None for x in s.overall)
    md = render_markdown(s, "t", [])
    assert "| hf:lookup |" in md and "—" in md


def test_markdown_has_a_table_per_category_and_lossless_counts():
    md = render_markdown(summarize(ROWS, ["code_edit", "writing"]), "speczoo peers: x", ["note one"])
    assert "## Overall" in md and "## code_edit" in md and "## writing" in md
    assert "- note one" in md
    overall = md.split("## code_edit")[0]
    assert "| speczoo:ngram | speczoo:ngram | 3 |" in overall
    assert "| 2.00x | 2/3 |" in overall
    assert "| llama:greedy | llama:greedy | 3 | 303 | 60.00 | 1.00x | reference |" in overall


# -- lossless judgement --------------------------------------------------------------------------------

def _gen(ids, text="", finish="length"):
    return PeerOutput(ids=ids, text=text, finish=finish, seconds=1.0, tokens=len(ids), total_seconds=1.0,
                      timing="first-token")


def test_judge_by_ids():
    ref = {"ids": [1, 2, 3], "text": "abc", "finish": "length"}
    assert judge(_gen([1, 2, 3]), ref, "ids") == (True, None)
    assert judge(_gen([1, 5, 3]), ref, "ids") == (False, [0, 1])
    assert judge(_gen([1, 2]), ref, "ids") == (False, [0, 2])          # shorter is not equal
    assert judge(_gen([1, 2, 3]), None, "ids") == (None, None)          # no reference ran


def test_judge_by_text_allows_running_past_the_limit_only_after_greedys_text():
    ref = {"ids": [], "text": "def f(y):", "finish": "length"}
    assert judge(_gen([], "def f(y):"), ref, "text") == (True, None)
    assert judge(_gen([], "def f(y):\n    return"), ref, "text") == (True, None)
    assert judge(_gen([], "def f(x):"), ref, "text") == (False, [0, 6])
    stopped = dict(ref, finish="stop")                                     # greedy ended at EOS
    assert judge(_gen([], "def f(y):\n    return"), stopped, "text")[0] is False


def test_make_row_marks_references_and_judges_the_others():
    s = settings()
    ref = make_row(PROMPTS[0], "speczoo", "off", "plain", _gen([4, 5, 6]), s, None, None)
    assert ref["lossless"] is None and ref["reference"] is None and ref["system"] == "speczoo:off"
    row = make_row(PROMPTS[0], "speczoo", "ngram", "lookup", _gen([4, 5, 7]), s, ("speczoo:off", "ids"), ref)
    assert row["lossless"] is False and row["first_mismatch"] == [0, 2]
    assert row["tok_s"] == pytest.approx(3.0) and row["prompt_tokens"] == 6 and row["threads"] == 2


# -- systems and missing peers ------------------------------------------------------------------------

def test_parse_systems():
    assert parse_systems(None) == {f: None for f in peers.FAMILIES}
    assert parse_systems("speczoo,hf:lookup,hf:greedy") == {"hf": ["lookup", "greedy"], "speczoo": None}
    assert parse_systems("hf:lookup,hf") == {"hf": None}
    with pytest.raises(ValueError, match="unknown family 'sglang'"):
        parse_systems("sglang")
    # `speczoo peers` offers vllm only with --vllm VENV: without it the family is unknown there
    with pytest.raises(ValueError, match="unknown family 'vllm'"):
        parse_systems("vllm", [f for f in peers.FAMILIES if f != "vllm"])


def test_missing_peer_is_skipped_with_install_instructions_and_others_run(tmp_path, monkeypatch, capsys):
    real = peers.missing_modules
    monkeypatch.setattr(peers, "missing_modules",
                        lambda names: [n for n in names if n in ("transformers", "llama_cpp")] or real(()))
    fam = SpeczooFamily(settings(draft=None, draft_gguf=None), runtime=FakeRuntime(max_seq=4096))
    out = run_peers(PROMPTS[:1], settings(draft=None, draft_gguf=None), tmp_path,
                    systems={"llama": None, "hf": None, "speczoo": None}, families={"speczoo": fam})
    assert [r["system"] for r in out.rows] == ["speczoo:off", "speczoo:ngram", "speczoo:auto"]
    assert any("hf: skipped, transformers not installed" in n and "pip install -e '.[peers]'" in n
               for n in out.notes)
    assert any("llama: skipped, llama-cpp-python not installed" in n for n in out.notes)
    assert any("baseline llama:greedy did not run" in n for n in out.notes)
    err = capsys.readouterr().err
    assert "pip install -e '.[peers]'" in err and "8 minutes" in err
    md = (tmp_path / "peers.md").read_text()
    assert "pip install -e '.[peers]'" in md
    assert len((tmp_path / "peers.jsonl").read_text().splitlines()) == 3


def test_no_system_at_all_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "missing_modules", lambda names: list(names))
    with pytest.raises(PeerError, match="no system ran"):
        run_peers(PROMPTS[:1], settings(), tmp_path, systems={"hf": None})


def test_unknown_method_of_a_family_is_an_error(tmp_path):
    fam = SpeczooFamily(settings(), runtime=FakeRuntime())
    with pytest.raises(ValueError, match="speczoo has no method eagle"):
        run_peers(PROMPTS[:1], settings(), tmp_path, systems={"speczoo": ["eagle"]}, families={"speczoo": fam})


def test_speczoo_family_on_the_fake_runtime_is_lossless(tmp_path):
    s = settings(max_new_tokens=20)
    fam = SpeczooFamily(s, runtime=FakeRuntime(max_seq=4096, spec_modes=["off", "ngram", "draft", "auto"]))
    out = run_peers(PROMPTS, s, tmp_path, systems={"speczoo": None}, families={"speczoo": fam}, quiet=True)
    assert len(out.rows) == 3 * 4
    for r in out.rows:
        assert r["timing"] == "engine"
        assert r["lossless"] is (None if r["method"] == "off" else True)
        assert r["new_tokens"] == 20 and r["tokens"] == 19
    rows = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    assert rows == out.rows
    assert out.summary.system("speczoo:draft").lossless == 3


# -- llama-cpp-python against a fake -------------------------------------------------------------------

class FakeLookup:
    def __init__(self, max_ngram_size=2, num_pred_tokens=10):
        self.num_pred_tokens = num_pred_tokens


class FakeLlama:
    """Answers are a function of the prompt; with a draft model, prompt [99, ...] goes wrong at token 3."""

    made = []

    def __init__(self, model_path, **kw):
        self.model_path, self.kw, self.resets, self.closed, self.calls = model_path, kw, 0, False, []
        FakeLlama.made.append(self)

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **kw):
        self.calls.append((list(tokens), kw))
        seq = [(sum(tokens) + 7 * i) % 200 + 10 for i in range(30)]
        if tokens[-1] == 3:
            seq[5] = EOS                                   # question 1 ends at EOS after 5 tokens
        if self.kw["draft_model"] is not None and tokens[0] == 99:
            seq[3] += 1
        yield from seq
        raise AssertionError("the consumer must stop at EOS or the token limit")

    def detokenize(self, ids):
        return "".join(chr(65 + i % 26) for i in ids).encode()

    def close(self):
        self.closed = True


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    FakeLlama.made = []
    mod = types.ModuleType("llama_cpp")
    mod.Llama = FakeLlama
    spec_mod = types.ModuleType("llama_cpp.llama_speculative")
    spec_mod.LlamaPromptLookupDecoding = FakeLookup
    mod.llama_speculative = spec_mod
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec_mod)
    return mod


def test_llama_family_greedy_and_lookup_against_a_fake(tmp_path, fake_llama_cpp):
    s = settings(max_new_tokens=12, k=8, threads=2, n_ctx=320)
    fam = LlamaCppFamily(s)
    out = run_peers(PROMPTS, s, tmp_path, systems={"llama": None}, families={"llama": fam}, quiet=True)
    assert [r["system"] for r in out.rows[:2]] == ["llama:greedy", "llama:lookup"]
    greedy, lookup = FakeLlama.made
    assert greedy.kw["draft_model"] is None and greedy.kw["logits_all"] is False
    assert isinstance(lookup.kw["draft_model"], FakeLookup) and lookup.kw["draft_model"].num_pred_tokens == 8
    assert lookup.kw["logits_all"] is True
    for llm in (greedy, lookup):
        assert llm.model_path == "/models/target.gguf"
        assert (llm.kw["n_threads"], llm.kw["n_threads_batch"], llm.kw["n_ctx"]) == (2, 2, 320)
        assert llm.resets == 3 and llm.closed
        prompt_ids, kw = llm.calls[0]
        assert prompt_ids == PROMPTS[0].ids
        assert kw["temp"] == 0.0 and kw["top_k"] == 1 and kw["repeat_penalty"] == 1.0
    by = {(r["question_id"], r["system"]): r for r in out.rows}
    q1 = by[(1, "llama:greedy")]
    assert (q1["new_tokens"], q1["finish"], q1["tokens"]) == (5, "stop", 5)
    assert EOS not in q1["ids"] and q1["text"] == "".join(chr(65 + i % 26) for i in q1["ids"])
    q2 = by[(2, "llama:greedy")]
    assert (q2["new_tokens"], q2["finish"], q2["tokens"], q2["timing"]) == (12, "length", 11, "first-token")
    assert by[(1, "llama:lookup")]["lossless"] is True
    assert by[(2, "llama:lookup")]["lossless"] is True
    assert by[(3, "llama:lookup")]["lossless"] is False
    assert by[(3, "llama:lookup")]["first_mismatch"] == [0, 3]
    assert out.summary.system("llama:lookup").lossless == 2
    assert out.summary.system("llama:lookup").judged == 3


def test_warm_up_answers_are_untimed_and_not_recorded(tmp_path, fake_llama_cpp):
    s = settings(warmup=3)
    out = run_peers(PROMPTS[1:], s, tmp_path, systems={"llama": None}, families={"llama": LlamaCppFamily(s)},
                    quiet=True)
    greedy, lookup = FakeLlama.made
    assert len(greedy.calls) == 1 + 2 and len(lookup.calls) == 1 + 2     # warm-up + the two questions
    assert greedy.calls[0][0] == PROMPTS[1].ids
    assert len(out.rows) == 4 and all(r["new_tokens"] == 12 for r in out.rows)
    assert "3 tokens of warm-up" in out.markdown


def test_llama_family_says_how_to_install_when_llama_cpp_is_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)      # import raises ImportError
    with pytest.raises(PeerError, match=r"pip install -e '\.\[peers\]'"):
        LlamaCppFamily(settings()).open()


# -- llama.cpp's tool against a fake runner -----------------------------------------------------------

def _tool_out(prompt_text, answer, n=7, seconds=0.5):
    stdout = "\n\n" + prompt_text + answer + "\n\n" + "\n\n"
    stderr = (f"main: encoded   12 tokens in    0.100 seconds, speed:  120.000 t/s\n"
              f"main: decoded {n:4d} tokens in {seconds:8.3f} seconds, speed: {n / seconds:8.3f} t/s\n\n"
              "main: n_draft   = 8\nmain: n_predict = 7\nmain: n_drafted = 16\nmain: n_accept  = 5\n")
    return stdout, stderr


def test_parse_tool_output():
    stdout, stderr = _tool_out("<u>hi</u>", "Hello\n\nthere")
    assert parse_tool_output(stdout, stderr, "<u>hi</u>") == ("Hello\n\nthere", 7, 0.5, 16, 5)
    with pytest.raises(PeerError, match="no 'decoded N tokens"):
        parse_tool_output(stdout, "error: bad flag", "<u>hi</u>")
    with pytest.raises(PeerError, match="did not echo the prompt"):
        parse_tool_output("\n\nsomething else", stderr, "<u>hi</u>")


def test_llama_cli_family_with_a_fake_tool(tmp_path):
    tool = tmp_path / "llama-speculative-simple"
    tool.write_text("#!/bin/sh\n")
    s = settings(llama_cli=str(tool), max_new_tokens=7, k=8)
    calls = []

    def runner(cmd, **kw):
        calls.append(cmd)
        prompt = cmd[cmd.index("-p") + 1]
        answer = "ABCDEFG" if "draft-simple" in cmd else "ABCDEFGHIJ"   # the n-gram ones ran past -n
        if "ngram-mod" in cmd:
            answer = "ABXDEFG"
        out, err = _tool_out(prompt, answer, n=9 if "ngram-simple" in cmd else 7)
        return types.SimpleNamespace(returncode=0, stdout=out, stderr=err)

    fam = LlamaCliFamily(s, runner=runner)
    assert fam.methods() == ["draft", "ngram-simple", "ngram-mod"]
    greedy_ref = make_row(PROMPTS[0], "llama", "greedy", "g", _gen([1] * 7, "ABCDEFG", "length"), s, None, None)
    rows = {m: make_row(PROMPTS[0], "llama-cli", m, fam.describe(m), fam.generate(m, PROMPTS[0], 7), s,
                        fam.reference(m), greedy_ref) for m in fam.methods()}
    assert rows["draft"]["lossless"] is True and rows["draft"]["compare"] == "text"
    assert rows["ngram-simple"]["lossless"] is True            # ran past the limit after greedy's text
    assert rows["ngram-mod"]["lossless"] is False
    assert rows["draft"]["timing"] == "reported" and rows["draft"]["tok_s"] == pytest.approx(14.0)
    assert (rows["draft"]["drafted"], rows["draft"]["accepted"]) == (16, 5)
    draft_cmd = calls[0]
    for flag, value in [("-m", "/models/target.gguf"), ("-md", "/models/draft.gguf"), ("-t", "2"),
                        ("-n", "7"), ("--temp", "0"), ("--top-k", "1"), ("--spec-draft-n-max", "8"),
                        ("-c", "256")]:
        assert draft_cmd[draft_cmd.index(flag) + 1] == value


def test_llama_cli_failure_and_absence_are_clear(tmp_path, monkeypatch):
    tool = tmp_path / "tool"
    tool.write_text("")
    fam = LlamaCliFamily(settings(llama_cli=str(tool)), runner=lambda cmd, **kw: types.SimpleNamespace(
        returncode=1, stdout="", stderr="error: invalid argument: --spec-type"))
    with pytest.raises(PeerError, match="(?s)exited with status 1.*invalid argument"):
        fam.generate("ngram-simple", PROMPTS[0], 7)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PeerError, match="not on PATH"):
        LlamaCliFamily(settings())
    assert "cmake" in BUILD_HINT
    out = run_peers(PROMPTS[:1], settings(), tmp_path / "o", systems={"llama-cli": None, "speczoo": None},
                    families={"speczoo": SpeczooFamily(settings(), runtime=FakeRuntime())}, quiet=True)
    assert any(n.startswith("llama-cli: skipped") and "not on PATH" in n for n in out.notes)


# -- real: one tiny run through each available peer ---------------------------------------------------

def _pulled(name):
    from speczoo.errors import SpeczooError
    from speczoo.zoo.bundle import find_bundle, source_gguf

    try:
        source_gguf(find_bundle(name))
    except (SpeczooError, FileNotFoundError) as exc:
        return str(exc)
    return None


REAL_TARGET = "smollm2-135m"      # the zoo's smallest: a GGUF load is most of a peer's short run
REAL_FAMILIES = {"llama": ("llama_cpp",), "hf": ("transformers", "accelerate"), "speczoo": ()}


@pytest.mark.real
@pytest.mark.parametrize("family", list(REAL_FAMILIES))
def test_real_tiny_run(family, tmp_path, capsys):
    absent = [m for m in REAL_FAMILIES[family] if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{family} peer needs {', '.join(absent)}: pip install -e '.[peers]'")
    why = _pulled(REAL_TARGET)
    if why:
        pytest.skip(f"{REAL_TARGET} is not usable ({why})")
    from speczoo.cli import main

    # The 0.5B drafts for itself: cheap, and it exercises every draft-model path.
    rc = main(["peers", REAL_TARGET, "--questions", "builtin", "--categories", "code_edit", "--limit", "1",
               "--gen", "8", "--draft", REAL_TARGET, "--systems", family, "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    expected = {"llama": ["greedy", "lookup"], "hf": ["greedy", "lookup", "assistant"],
                "speczoo": ["off", "ngram", "draft", "auto"]}[family]
    assert [r["method"] for r in rows] == expected
    for r in rows:
        assert 1 <= r["new_tokens"] <= 8 and r["seconds"] > 0 and r["tok_s"] > 0
        assert r["threads"] == 2 and r["target_gguf"].endswith(".gguf")
    if family == "speczoo":
        assert all(r["lossless"] for r in rows[1:]), "speczoo's speculative modes must equal its greedy"
    assert f"| {family}:{expected[0]} |" in capsys.readouterr().out

"""`speczoo peers`: row and summary arithmetic, the lossless judgement, missing peers, llama-server's family
against tests/fake_llama_server.py, speczoo's family on the fake runtime, and (real) a tiny run through each
peer."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from fake_runtime import FakeRuntime
from speczoo.bench import peers
from speczoo.bench.peers import (
    PeerOutput, PeerError, PeerPrompt, PeerSettings, SpeczooFamily, cut_at_eos, judge, make_row,
    parse_systems, run_peers, timed_tokens)
from speczoo.bench.peers_summary import render_markdown, summarize
from speczoo.bench.peers_llama import BUILD_HINT, LlamaServerFamily

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
    from speczoo.bench import serve_load_llama

    real = peers.missing_modules
    monkeypatch.setattr(peers, "missing_modules",
                        lambda names: [n for n in names if n == "transformers"] or real(()))
    monkeypatch.delenv(serve_load_llama.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(serve_load_llama, "OPT_GLOB", str(tmp_path / "none-*"))
    fam = SpeczooFamily(settings(draft=None, draft_gguf=None), runtime=FakeRuntime(max_seq=4096))
    out = run_peers(PROMPTS[:1], settings(draft=None, draft_gguf=None), tmp_path,
                    systems={"llama": None, "hf": None, "speczoo": None}, families={"speczoo": fam})
    assert [r["system"] for r in out.rows] == ["speczoo:off", "speczoo:ngram", "speczoo:auto"]
    assert any("hf: skipped, transformers not installed" in n and "pip install -e '.[peers]'" in n
               for n in out.notes)
    assert any("llama: skipped, no llama-server found" in n and "build_llama.sh" in n for n in out.notes)
    assert any("baseline llama:greedy did not run" in n for n in out.notes)
    err = capsys.readouterr().err
    assert "pip install -e '.[peers]'" in err and "build_llama.sh" in err
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


# -- llama-server against tests/fake_llama_server.py ----------------------------------------------------

FAKE_SERVER = str(Path(__file__).parents[1] / "fake_llama_server.py")


def fake_completion_ids(prompt_ids: list[int], n: int) -> list[int]:
    """What tests/fake_llama_server.py answers to prompt ids on /completion."""
    return [100 + (sum(prompt_ids) + 7 * i) % 50 for i in range(n)]


def started(argv_file: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in argv_file.read_text().splitlines()]


def test_llama_server_family_runs_every_mode_on_its_own_server(tmp_path, monkeypatch):
    argv_file = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_ARGV", str(argv_file))
    monkeypatch.setenv("FAKE_LLAMA_WRONG", "ngram-simple")
    s = settings(max_new_tokens=12, k=8, threads=2, n_ctx=320, warmup=2, llama_server=FAKE_SERVER)
    fam = LlamaServerFamily(s)
    assert fam.methods() == ["greedy", "ngram-mod", "ngram-simple", "draft"]
    assert fam.describe("greedy") == "llama-server, plain greedy"
    assert fam.describe("draft") == "llama-server --spec-type draft-simple -md --spec-draft-n-max 7 -td 2 -tbd 2"
    out = run_peers(PROMPTS, s, tmp_path / "out", systems={"llama": None}, families={"llama": fam}, quiet=True)
    assert [r["system"] for r in out.rows[:4]] == ["llama:greedy", "llama:ngram-mod", "llama:ngram-simple",
                                                   "llama:draft"]
    starts = started(argv_file)
    assert len(starts) == 4, "one server per mode, kept across questions"
    by_mode = {(a[a.index("--spec-type") + 1] if "--spec-type" in a else "none"): a for a in starts}
    assert set(by_mode) == {"none", "ngram-mod", "ngram-simple", "draft-simple"}
    draft = by_mode["draft-simple"]
    assert draft[draft.index("-md") + 1] == "/models/draft.gguf" and draft[draft.index("--spec-draft-n-max") + 1] == "7"
    for a in starts:
        assert a[a.index("-m") + 1] == "/models/target.gguf" and a[a.index("--threads") + 1] == "2"
        assert a[a.index("--parallel") + 1] == "1" and int(a[a.index("-c") + 1]) >= 320 + 64
    for r in out.rows:
        prompt = next(p for p in PROMPTS if p.question_id == r["question_id"])
        expected = fake_completion_ids(prompt.ids, 12)
        if r["method"] == "ngram-simple" and prompt.ids[0] == 99:
            expected[3] += 1
        assert r["ids"] == expected and r["timing"] == "reported" and r["tokens"] == 11
        assert r["seconds"] == pytest.approx((5.0 if r["method"] != "greedy" else 10.0) * 12 / 1000)
    by = {(r["question_id"], r["method"]): r for r in out.rows}
    assert by[(1, "greedy")]["lossless"] is None and by[(1, "ngram-mod")]["lossless"] is True
    assert by[(3, "ngram-simple")]["lossless"] is False and by[(3, "ngram-simple")]["first_mismatch"] == [0, 3]
    assert out.summary.system("llama:ngram-simple").lossless == 2 and out.summary.system("llama:draft").lossless == 3
    assert by[(1, "draft")]["drafted"] == 12 and by[(1, "draft")]["accepted"] == 6
    assert not fam._servers, "close() stops every server"


def test_llama_server_family_without_a_draft_and_without_a_binary(tmp_path, monkeypatch):
    from speczoo.bench import serve_load_llama

    s = settings(draft=None, draft_gguf=None, llama_server=FAKE_SERVER)
    assert LlamaServerFamily(s).methods() == ["greedy", "ngram-mod", "ngram-simple"]
    with pytest.raises(PeerError, match="--llama-server /nowhere is neither a file"):
        LlamaServerFamily(settings(llama_server="/nowhere"))
    monkeypatch.delenv(serve_load_llama.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(serve_load_llama, "OPT_GLOB", str(tmp_path / "none-*"))
    out = run_peers(PROMPTS[:1], settings(), tmp_path / "o", systems={"llama": None, "speczoo": None},
                    families={"speczoo": SpeczooFamily(settings(), runtime=FakeRuntime())}, quiet=True)
    assert any(n.startswith("llama: skipped") and "benchmarks/build_llama.sh" in n for n in out.notes)
    assert BUILD_HINT in " ".join(out.notes)


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
REAL_FAMILIES = {"llama": (), "hf": ("transformers", "accelerate"), "speczoo": ()}


@pytest.mark.real
@pytest.mark.parametrize("family", list(REAL_FAMILIES))
def test_real_tiny_run(family, tmp_path, capsys):
    absent = [m for m in REAL_FAMILIES[family] if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{family} peer needs {', '.join(absent)}: pip install -e '.[peers]'")
    if family == "llama":
        from speczoo.bench.serve_load_llama import find_llama_server

        if find_llama_server() is None:
            pytest.skip("no llama-server: bash benchmarks/build_llama.sh, then set $SPECZOO_LLAMA_SERVER")
    why = _pulled(REAL_TARGET)
    if why:
        pytest.skip(f"{REAL_TARGET} is not usable ({why})")
    from speczoo.cli import main

    # The 0.5B drafts for itself: cheap, and it exercises every draft-model path.
    rc = main(["peers", REAL_TARGET, "--questions", "builtin", "--categories", "code_edit", "--limit", "1",
               "--gen", "8", "--draft", REAL_TARGET, "--systems", family, "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    expected = {"llama": ["greedy", "ngram-mod", "ngram-simple", "draft"], "hf": ["greedy", "lookup", "assistant"],
                "speczoo": ["off", "ngram", "draft", "auto"]}[family]
    assert [r["method"] for r in rows] == expected
    for r in rows:
        assert 1 <= r["new_tokens"] <= 8 and r["seconds"] > 0 and r["tok_s"] > 0
        assert r["threads"] == 2 and r["target_gguf"].endswith(".gguf")
    if family == "speczoo":
        assert all(r["lossless"] for r in rows[1:]), "speczoo's speculative modes must equal its greedy"
    if family == "llama":
        assert all(r["timing"] == "reported" and r["lossless"] is not None for r in rows[1:])
    assert f"| {family}:{expected[0]} |" in capsys.readouterr().out

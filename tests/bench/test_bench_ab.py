"""The A/B bench's inputs and report lines (model-free)."""

import pytest

from speczoo.bench.ab import ABResult, Divergence, read_prompt_ids


def test_prompt_ids_file_round_trip(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("1 2 3\n4\t5\n")
    assert read_prompt_ids(str(f), 10) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("text,msg", [("1 2 x 4", "item 3 is 'x'"), ("", "no token ids"),
                                      ("1 99 2", "outside the vocabulary"), ("-1", "outside the vocabulary")])
def test_bad_prompt_ids_files_are_clear_errors(tmp_path, text, msg):
    f = tmp_path / "ids.txt"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        read_prompt_ids(str(f), 10)


def test_lines_pass_and_fail_with_diagnosis():
    ok = ABResult(greedy_ids=[1, 2, 3], spec_ids=[1, 2, 3], greedy_tok_s=[10, 12, 11], spec_tok_s=[30, 33, 31],
                  accepted_per_round=2.5, forwards=4)
    assert ok.lines()[0] == "SPEC LOSSLESS 3/3 PASS"
    assert ok.lines()[1] == ("SPEC STATS greedy=11.00 tok/s spec=31.00 tok/s speedup=2.82x "
                             "accepted/round=2.50 forwards=4")
    bad = ABResult(greedy_ids=[1, 2, 3], spec_ids=[1, 5, 3], greedy_tok_s=[10], spec_tok_s=[20],
                   divergence=Divergence(1, 2, 5, gap=0.01))
    assert bad.lines()[0] == "SPEC LOSSLESS 1/3 FAIL"
    assert "near-tie" in bad.lines()[2] and "not a bug" in bad.lines()[2]
    assert "NOT a near-tie" in Divergence(1, 2, 5, gap=3.0).describe()


def test_sampled_runs_do_not_claim_a_token_match():
    r = ABResult(greedy_ids=[1, 2, 3], spec_ids=[1, 7, 9], greedy_tok_s=[10], spec_tok_s=[20], sampled=True)
    head = r.lines()[0]
    assert head.startswith("SPEC LOSSLESS n/a when sampling") and "FAIL" not in head
    assert head.endswith("reproducible from its seed across runs: yes")
    r.lossless_runs = False
    assert r.lines()[0].endswith("NO")



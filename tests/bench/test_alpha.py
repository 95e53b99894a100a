"""The model-free prompt-lookup proxy on hand-made texts whose answers are computed by hand."""

import json

import pytest

from speczoo.bench import alpha
from speczoo.cli import main


def test_word_pieces_round_trip_and_rule():
    text = "def f(x):\n    return x+1  # done\n\n"
    pieces = alpha.word_pieces(text)
    assert "".join(pieces) == text
    assert pieces[:6] == ["def", " f", "(", "x", ")", ":"]
    assert "\n    return" in pieces and "  #" in pieces and "\n\n" in pieces


def test_exact_repeat_known_answer():
    # 0..9 then 0..9 again, n = 1, K = 8, computed by hand:
    # rounds 1..10 emit 0..9 with no draft (all distinct); round 11 emits the second 0 (the 1-gram
    # "9" has no earlier continuation); round 12 looks up "0", drafts 1..8, all accepted, + bonus 9.
    ids = list(range(10)) * 2
    r = alpha.simulate(ids, ngram=1, k=8)
    assert (r.tokens, r.rounds, r.drafted, r.accepted, r.rounds_with_draft) == (20, 12, 8, 8, 1)
    assert r.accepted_per_round == pytest.approx(8 / 12)
    assert r.coverage == pytest.approx(8 / 20)
    assert r.tokens_per_round == pytest.approx(20 / 12)
    assert r.alpha == 1.0
    assert r.pos_drafted == [1] * 8 and r.pos_accepted == [1] * 8


def test_no_repeats_accepts_nothing():
    text = " ".join(f"w{i}" for i in range(50))
    for n in (1, 2, 3, 4):
        r = alpha.alpha_for_texts({"t": text}, [n], k=8)[0]
        assert r.accepted == 0 and r.drafted == 0 and r.coverage == 0.0
        assert r.rounds == r.tokens == 50 and r.tokens_per_round == 1.0


def test_periodic_text_copies_through_its_own_draft():
    # "a b a b ..." (period 2, 40 tokens). Round 1: a. Round 2: "a" has no continuation yet → b.
    # Round 3: "b" unseen before → a... let us count: after [a, b], "b" never had a continuation, so
    # round 3 emits a with no draft; after [a, b, a], "a" continues at 1 → draft b,a,b,a,... (LZ copy),
    # K = 8 all accepted + bonus = 9 tokens per round from then on.
    ids = [0, 1] * 20
    r = alpha.simulate(ids, ngram=1, k=8)
    # 3 single rounds, then 37 tokens: 4 rounds of 9 (36 tokens) + 1 round with a 1-token draft cut
    # at the end of the text (accepted 1, no bonus).
    assert r.rounds == 3 + 4 + 1
    assert r.accepted == 4 * 8 + 1
    assert r.tokens_per_round == pytest.approx(40 / 8)


def test_wrong_draft_counts_positions():
    # 1 2 3 | 1 2 4 | 1 2 3 : with n=1, at "1" (second time) the draft is 2 3 1 2 ... → 2 accepted
    # then 3 != 4 rejected. Per-position: position 0 accepted, position 1 rejected.
    ids = [1, 2, 3, 1, 2, 4]
    r = alpha.simulate(ids, ngram=1, k=2)
    # rounds: 1 | 2 | 3 | 1 (lookup "3": none) | "1"→ draft [2, 3]: accept 2, correction 4 → done
    assert r.rounds == 5
    assert r.pos_drafted == [1, 1] and r.pos_accepted == [1, 0]
    assert r.acceptance_by_position == [1.0, 0.0]


def test_the_longest_reaching_match_is_copied_whatever_the_order():
    # a b X g b Y h a Z f a b X  (a=1 b=2 X=3 g=4 Y=5 h=6 Z=7 f=8), K = 1.
    # Both orders miss at "g b" (draft X, truth Y), at "h a" (draft b, truth Z) and at "f a" (draft Z,
    # truth b). The last round starts after "a b": of the occurrences of "b", prompt lookup copies the one
    # whose match reaches furthest back (Drafting.lookup_reach; issue #30), "a b" -> X (right), so the
    # order is only the shortest match drafted from; before that change the 1-gram drafted b's latest
    # continuation Y (wrong) and only the 2-gram got X.
    ids = [1, 2, 3, 4, 2, 5, 6, 1, 7, 8, 1, 2, 3]
    r1 = alpha.simulate(ids, ngram=1, k=1)
    r2 = alpha.simulate(ids, ngram=2, k=1)
    assert (r1.drafted, r1.accepted, r1.rounds) == (4, 1, 13)
    assert (r2.drafted, r2.accepted, r2.rounds) == (4, 1, 13)   # X was the last token: no bonus


def test_parse_orders():
    assert alpha.parse_orders("1..4") == [1, 2, 3, 4]
    assert alpha.parse_orders("1,2,3,4") == [1, 2, 3, 4]
    assert alpha.parse_orders("3") == [3]
    for bad in ("0", "a..b", "", "2..1"):
        with pytest.raises(ValueError):
            alpha.parse_orders(bad)


def test_cli_alpha(tmp_path, capsys):
    rep = tmp_path / "rep.txt"
    rep.write_text("the quick brown fox jumps. " * 10)
    uniq = tmp_path / "uniq.txt"
    uniq.write_text(" ".join(f"w{i}" for i in range(30)))
    assert main(["alpha", str(rep), str(uniq), "--ngram", "1..2", "--k", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["name"].endswith("rep.txt"), r["ngram"]) for r in out] == [
        (True, 1), (True, 2), (False, 1), (False, 2)]
    # K = 4 bounds coverage by 4/5; the first sentence (6 pieces + 1) is never drafted
    assert 0.6 < out[0]["coverage"] < 0.8 and out[2]["accepted"] == 0
    assert main(["alpha", str(rep), "--ngram", "1,3"]) == 0
    table = capsys.readouterr().out
    assert "E[tok/round]" in table and "rep.txt" in table


def test_cli_alpha_missing_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path))
    f = tmp_path / "a.txt"
    f.write_text("x")
    assert main(["alpha", str(f), "--model", "qwen2.5-coder-0.5b"]) == 2   # known, not pulled here
    assert "speczoo pull qwen2.5-coder-0.5b" in capsys.readouterr().err
    assert main(["alpha", str(f), "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err

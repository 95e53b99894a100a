"""benchmarks/ngram_situations.py, the replay that measured prompt lookup's situation priors
(Drafting.situation_priors), labels a hand-made answer as the drafter does."""

from benchmarks.ngram_situations import replay


def test_situation_replay_on_a_hand_made_answer():
    prompt = list(range(10, 30))
    answer = list(range(10, 20)) + [5]           # copies the prompt's first ten tokens, then leaves it
    got = replay(prompt, answer, k=4)
    # after a0 = 10 the one-token match "10" proposes 11 12 13 14: all right; the match grows from there
    assert got[0] == ("1/agree", 4)
    assert [s for s, _ in got[:3]] == ["1/agree", "2-3/agree", "2-3/agree"]
    assert got[-1] == ("8+/agree", 0)            # ... until the answer leaves the prompt (19 -> 5, not 20)
    assert got[-2] == ("8+/agree", 1)


def test_the_tree_runs_hold_the_chains_where_one_occurrence_leads():
    prompt = list(range(10, 30))
    answer = list(range(10, 20)) + [5]
    assert replay(prompt, answer, k=4, tree=True) == replay(prompt, answer, k=4)

"""The agentic replay drives the engine's rounds against a recorded answer: lossless, and it counts what
the drafters did (model-free)."""

from benchmarks.agentic_replay import Tally, drafters_for, replay_turn
from benchmarks.replay_profiles import PROFILES
from speczoo.decoding.drafters.suffix_memory import SuffixMemory
from speczoo.decoding.round import situations


def test_a_copied_answer_is_replayed_losslessly_in_few_rounds():
    passage = list(range(100, 140))
    prompt, out = [1, 2, 3] + passage + [4, 5], passage[:30]
    memory = SuffixMemory()
    for mode in ("ngram", "ngram-tree", "suffix", "auto"):
        t = replay_turn(prompt, out, drafters_for(mode, prompt, memory, 3), PROFILES["cheap-verify"], 8)
        assert t.lossless and t.tokens == 30
        assert t.rounds < 15 and t.accepted > 15 and t.drafted >= t.accepted
        assert 1.0 < t.speedup


def test_the_suffix_memory_remembers_a_turn_for_the_next():
    memory = SuffixMemory()
    answer = list(range(200, 230))
    replay_turn([7, 8, 9], answer, drafters_for("suffix", [7, 8, 9], memory, 3), PROFILES["cheap-verify"], 8)
    again = replay_turn([7, 8, 9], answer, drafters_for("suffix", [7, 8, 9], memory, 3), PROFILES["cheap-verify"], 8)
    assert again.lossless and again.accepted > 15


def test_auto_offers_the_tree_as_the_runtime_does_and_without_it_on_request():
    memory = SuffixMemory()
    auto = drafters_for("auto", [1, 2], memory, 3)
    assert list(auto) == ["ngram", "ngram-tree", "suffix"]
    agree = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3]       # the engine's rounds leave agreeing occurrences to the chain
    assert situations(auto, agree)["ngram-tree"] is None and situations(auto, agree)["ngram"] is not None
    assert list(drafters_for("auto", [1, 2], memory, 3, auto_trees=False)) == ["ngram", "suffix"]


def test_a_branching_record_is_replayed_losslessly_with_trees():
    """Records whose fields branch (the tool calls' keys and values): the tree rounds verify against the
    recording as the engine's do, and every mode emits exactly the answer."""
    # a field that is 81 every sixth record: what tells the two apart lies further back than lookup_reach,
    # so the occurrences' matches tie and the tree holds both values
    rows = [[50, 60, 70, 81 if i % 6 == 0 else 80, 90, 91, 92, 93] for i in range(40)]
    prompt = [x for r in rows[:30] for x in r]
    out = [x for r in rows[30:] for x in r]
    for mode in ("ngram-tree", "auto"):
        t = replay_turn(prompt, out, drafters_for(mode, prompt, SuffixMemory(), 3), PROFILES["cheap-verify"], 8)
        assert t.lossless and t.tokens == len(out)
        assert t.trees > 0 or mode == "auto"        # auto's pick depends on its prices; the tree's rounds branch


def test_tallies_add_up():
    a, b = Tally(2, 8, 6, 9, 4.0, trees=1), Tally(1, 4, 4, 5, 2.0, lossless=False, trees=2)
    a.add(b)
    assert (a.rounds, a.drafted, a.accepted, a.tokens, a.cost, a.lossless, a.trees) == (3, 12, 10, 14, 6.0, False, 3)
    assert a.per_round == 10 / 3 and a.speedup == 14 / 6.0

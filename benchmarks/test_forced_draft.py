"""benchmarks.forced_draft: the forced acceptance follows α, a forced draft proposes the truth then wrong ids
after real draft forwards, and a forced run on two tiny unrelated models is a real speculative run: equal to
greedy, with the accepted counts the coin chose."""

import random

import pytest

from benchmarks import forced_draft
from speczoo.decoding.pricing.cost import expected_tokens
from tiny_gguf import write_tiny_gguf


def test_the_forced_lengths_average_the_cost_model_s_accepted_count():
    coin = random.Random(0)
    for alpha, k in ((0.0, 4), (0.5, 4), (0.8, 3), (1.0, 5)):
        n = 20000
        mean = sum(forced_draft.forced_length(coin, alpha, k) for _ in range(n)) / n
        assert mean == pytest.approx(expected_tokens(alpha, k) - 1, abs=0.03)


class _Inner:
    """A draft model drafter's surface: what ForcedDraft calls, recorded."""

    def __init__(self):
        self.fed, self.synced = [], []

    def _sync(self, context):
        self.synced.append(list(context))
        return context[-1:]

    def _forward(self, ids):
        import torch
        self.fed.append(list(ids))
        return torch.zeros(len(ids), 10)

    def _pick(self, logits, qs, sure):
        return 0, 1.0

    def commit(self, accepted):
        pass


def test_a_forced_draft_runs_k_forwards_and_proposes_the_truth_then_wrong_ids():
    inner = _Inner()
    truth = [5, 6, 7, 8, 9, 3]
    prompt = [1, 2]
    always = forced_draft.ForcedDraft(inner, truth, len(prompt), alpha=1.0, seed=0, vocab=10)
    draft = always.propose(prompt + [5], 3)                    # output so far: none; a0 = truth[0]
    assert draft.tokens == [6, 7, 8] and inner.fed == [[5], [6], [7]] and always.forwards == 3
    never = forced_draft.ForcedDraft(_Inner(), truth, len(prompt), alpha=0.0, seed=0, vocab=10)
    assert never.propose(prompt + [5, 6, 7], 3).tokens == [9, 0, 4]      # truth[3:6] + 1, mod the vocabulary


def test_a_forced_run_on_tiny_models_equals_greedy_and_keeps_what_the_coin_chose(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    target, _ = write_tiny_gguf(tmp_path / "target.gguf", "qwen2", seed=0)
    draft, _ = write_tiny_gguf(tmp_path / "draft.gguf", "qwen2", seed=1)
    m = forced_draft.measure(str(target), str(draft), k=3, alpha=0.6, gen=24, runs=1, prompt="hello world",
                             seed=0, log=lambda _: None)
    assert m["lossless"]
    run = m["runs_detail"][0]
    # K = 3 forwards a round, fewer only where the budget left fewer tokens to draft
    assert run["draft_forwards"] == run["drafted"] and run["verifies"] == run["rounds"]
    assert run["drafted"] >= 3 * (run["rounds"] - 2)
    assert m["tokens_per_round"] == pytest.approx(1 + run["accepted"] / run["rounds"])
    assert 0 < run["accepted"] < 3 * run["rounds"]
    text = forced_draft.report(m)
    assert "the runtime's profile" in text and "timed in this run" in text and "equal to greedy: yes" in text


def test_the_gate_is_waived_only_within():
    from speczoo.decoding import pair

    before = pair.check_pair
    with forced_draft.gate_waived():
        assert pair.check_pair is not before
    assert pair.check_pair is before

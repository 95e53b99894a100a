"""Run lengths: the running mean of how many rounds in a row each drafter keeps the floor."""

from __future__ import annotations

import pytest

from speczoo.decoding.runs import RunLengths

RUN_PRIOR = 0.5


def test_runs_are_averaged_when_they_end():
    r = RunLengths(["ngram", "draft"], prior=RUN_PRIOR, weight=0.5)
    assert r.expected("draft") == RUN_PRIOR
    for d in ["draft"] * 4 + ["none"] + ["draft"] * 2 + ["ngram"]:
        r.round(d)
    # runs of draft: 4, then 2 -> 0.5·(0.5·prior + 0.5·4) + 0.5·2
    assert r.expected("draft") == pytest.approx(0.5 * (0.5 * RUN_PRIOR + 0.5 * 4) + 0.5 * 2)
    assert r.expected("ngram") == RUN_PRIOR                # its run is still going: not counted yet


def test_run_lengths_refuse_nonsense():
    for prior, weight in ((0.0, 0.5), (0.5, 0.0), (0.5, 1.5)):
        with pytest.raises(ValueError):
            RunLengths(["draft"], prior, weight)

"""The round-costs bench (python -m benchmarks.round_costs): rounds timed from the events as they stream, the first
(which carries the prefill) only starting the clock, priced in the greedy turn's steps, and reported by kind.
On streamed events and a clock made here; speeds are measured by the bench, never asserted here."""

import pytest

from benchmarks import round_costs as rc
from speczoo.events import DoneEvent, Stats, TokenEvent


def clock_of(times):
    it = iter(times)
    return lambda: next(it)


def test_rounds_are_timed_between_events_and_the_first_only_starts_the_clock():
    events = [TokenEvent(ids=[1], text="a"),                                   # a0 after the prefill
              TokenEvent(ids=[2, 3, 4], text="bcd", drafted=3, accepted=2, drafter="ngram"),
              TokenEvent(ids=[5], text="e"),                                   # a plain round
              DoneEvent(finish_reason="length", text="abcde", ids=[1, 2, 3, 4, 5],
                        stats=Stats(new_tokens=5, seconds=0.25))]
    turn = rc.timed(events, clock_of([10.0, 10.12, 10.17, 10.2]))
    assert [(d, k, round(s, 6), n) for d, k, s, n in turn.rounds] == [("ngram", 3, 0.12, 3), (rc.PLAIN, 0, 0.05, 1)]
    assert (turn.tokens, turn.seconds, turn.text) == (5, 0.25, "abcde")


def test_a_generation_without_its_done_event_is_an_error():
    with pytest.raises(RuntimeError, match="DoneEvent"):
        rc.timed([TokenEvent(ids=[1], text="a")], clock_of([1.0]))


def test_rounds_are_priced_in_the_greedy_turns_steps_and_reported_by_kind():
    greedy = rc.Turn([], tokens=100, seconds=5.0, text="")                            # 50 ms a step
    turn = rc.Turn([("draft", 1, 0.075, 1), ("draft", 1, 0.075, 2), ("none", 0, 0.05, 1)], tokens=100, seconds=4.0,
                   text="")
    kinds: dict = {}
    assert rc.price(turn, greedy, kinds) == pytest.approx(1.25)                # 25 tok/s against 20
    assert kinds[("draft", 1)].steps == pytest.approx([1.5, 1.5]) and kinds[("draft", 1)].tokens == 3
    assert kinds[("draft", 1)].per_step == pytest.approx(1.0)
    lines = rc.report("auto", [1.25, 0.8], kinds)
    assert lines[0] == "== auto: 1.000 tokens per greedy step (geometric mean over 2 turns)"
    assert any(line.startswith("  draft      drafted  1:     2 rounds,  1.50 steps a round") for line in lines)
    plain = "  none       all       :     1 rounds,     1.0 steps,     1 tokens,  1.00"
    assert any(line.startswith(plain) for line in lines)


@pytest.mark.parametrize("argv, message", [(["--methods", "off,auto"], "speculative modes only"),
                                           (["--methods", ""], "speculative modes only"),
                                           (["--limit", "0"], ">= 1")])
def test_bad_arguments_stop_before_anything_loads(argv, message):
    with pytest.raises(SystemExit, match=message):
        rc.main(argv)

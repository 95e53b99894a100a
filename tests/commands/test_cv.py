"""`speczoo cv MODEL`: the measured c_v(S) table, and the ceiling it sets (S / c_v(S) at the best S: the most
any drafter can give on these forwards), on the smallest real model, and as JSON for scripts."""

import json

import pytest
from real_models import SMOLLM_NAME

from speczoo import cli


def test_prints_the_curve_and_its_ceiling(capsys):
    assert cli.main(["cv", SMOLLM_NAME, "--sizes", "1,2,3", "--repeats", "1", "--context", "8"]) == 0
    out = capsys.readouterr().out
    rows = {int(line.split()[0]): float(line.split()[2]) for line in out.splitlines()
            if line.split() and line.split()[0].isdigit()}
    assert set(rows) == {1, 2, 3} and rows[1] == 1.0
    line = next(line for line in out.splitlines() if line.startswith("ceiling:"))
    top = float(line.split()[1].rstrip("x"))
    # the rows print c_v to 2 decimals: the ceiling agrees with them to that rounding
    assert top == pytest.approx(max(s / rows[s] for s in (2, 3)), rel=0.03) and "no drafter gets more" in line


def test_json_has_the_curve(capsys):
    assert cli.main(["cv", SMOLLM_NAME, "--sizes", "1,2", "--repeats", "1", "--context", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["cv"]["1"] == 1.0 and set(data["cv"]) == {"1", "2"}


def test_it_times_the_one_row_prefetch_first_or_takes_it_forced(capsys):
    """The choice a cost profile makes (both ways timed, the faster kept) is printed and in the JSON; forced
    on or off it is only said; --save refuses a forced one, which no load would have timed."""
    assert cli.main(["cv", SMOLLM_NAME, "--sizes", "1,2", "--repeats", "1", "--context", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(data["one_row"]) == {"prefetch", "ms", "rounds"} and set(data["one_row"]["ms"]) == {"none", "prefetch"}
    assert cli.main(["cv", SMOLLM_NAME, "--sizes", "1,2", "--repeats", "1", "--context", "8"]) == 0
    assert "one-row software prefetch " in capsys.readouterr().out
    for forced in ("on", "off"):
        assert cli.main(["cv", SMOLLM_NAME, "--sizes", "1", "--repeats", "1", "--one-row-prefetch", forced]) == 0
        assert f"one-row software prefetch {forced} (forced)" in capsys.readouterr().out
    assert cli.main(["cv", SMOLLM_NAME, "--one-row-prefetch", "on", "--save"]) == 2
    assert "--save stores the profile a load would time" in capsys.readouterr().err

"""The research scripts in benchmarks/ stay runnable: each imports and parses its arguments as
`python -m benchmarks.NAME` would (their arithmetic is tested beside the code it judges). A live A/B
whose logic is its own (stale_ab) also runs end to end here, on oracles that sleep."""

import contextlib
import importlib
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reference import HashOracle, OracleModel, TokenCache

from benchmarks import stale_ab
from speczoo.decoding.tuning import PRICING
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.engine import Engine
from offered import offered

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")          # not their tests beside them
                 if p.stem not in ("__init__", "conftest") and not p.stem.startswith("test_")
                 and "def main(" in p.read_text(encoding="utf-8"))


def test_every_script_is_found():
    assert {"auto_replay", "draft_replay", "drafters", "eagle_speed", "kernel_bench",
            "ngram_situations"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_parses_its_arguments(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_script_runs_from_the_repository_root():
    done = subprocess.run([sys.executable, "-m", "benchmarks.auto_replay", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


class Sleepy:
    """An oracle model whose every forward first sleeps `delay` seconds: timings the meter can trust."""

    def __init__(self, oracle, delay: float):
        self.model, self.delay = OracleModel(oracle), delay

    def __call__(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.model(*args, **kwargs)


def test_stale_ab_shows_a_drafter_priced_in_a_burst_coming_back_only_with_fading():
    """benchmarks.stale_ab end to end on oracles whose forwards take fixed sleeps: a burst that slows the
    draft 120-fold while it is first measured locks it out for good without fading, not with it; with
    no burst both arms draft throughout; the shipped half-life is restored afterwards."""
    base = HashOracle(16, seed=4)
    target, draft, draft_cache = Sleepy(base, 0.01), Sleepy(base, 0.0005), TokenCache(400)

    def factory(req):
        d = DraftModelDrafter(draft, draft_cache, req.sampling)
        d.reset()
        return d

    @contextlib.contextmanager
    def burst():
        draft.delay = 0.06
        yield
        draft.delay = 0.0005

    costs = Costs(cv=CvCurve.measured({1: 10.0, 2: 10.1, 5: 10.4, 9: 11.0}), draft_cost={"draft": 0.05},
                  round_overhead=0.02, step_ms=10.0)
    engine = Engine(target, TokenCache(400), offered({"draft": factory}), [], 200, costs=costs)
    prompts = [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(4)]
    results = stale_ab.measure(engine, prompts, 40, [8.0, math.inf], 1, burst)
    assert engine.pricing is PRICING                                          # restored
    (fading,), (stuck,) = results[("burst", 8.0)], results[("burst", math.inf)]
    assert fading.choices[1:] == "DDD" and stuck.choices[1:] == "---"     # request 0 ran in the burst
    assert fading.tok_s > stuck.tok_s and fading.tokens == stuck.tokens == 3 * 40
    assert stuck.priced > 1.0 > results[("control", math.inf)][0].priced    # the burst's price locks it out
    assert [s.choices for hl in (8.0, math.inf) for s in results[("control", hl)]] == ["DDDD", "DDDD"]
    lines = stale_ab.table(results, [8.0, math.inf])
    assert len(lines) == 4 and lines[0].startswith("burst") and "ratio 1.000" in lines[0]


def test_stale_ab_cpu_burst_runs_a_hog_only_inside_its_block():
    with stale_ab.cpu_burst(1) as hog:
        assert hog.poll() is None
    assert hog.poll() is not None

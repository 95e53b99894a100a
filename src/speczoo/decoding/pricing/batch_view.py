"""The price of one sequence's round inside a batched forward, as Costs the controller already reads.

Alone, a round with K draft tokens costs c_v(K + 1) target steps against 1 for a plain step. In a batch
the forward also carries R rows of the other sequences, which emit N tokens this step whatever this
sequence does; what this sequence decides is only how many rows it adds. Its K extra rows (and its
draft time, spent on the same cores before the forward) lengthen the step by
    Δ = c_v(R + K + 1) − c_v(R + 1) + K·draft_cost + overhead
and buy E(α, K) − 1 extra tokens. The batch as a whole emits (N + 1) tokens in c_v(R + 1) when this
sequence decodes plainly, a rate ρ = (N + 1) / c_v(R + 1); the extra rows pay exactly when
(E − 1) / Δ > ρ, i.e. when
    E(α, K) > 1 + ρ·Δ.
So the view hands the controller, in its own units (a plain round = 1.0):
    c_v'(S) = 1 + ρ·(c_v(R + S) − c_v(R + 1)),   draft_cost' = ρ·draft_cost,   overhead' = ρ·overhead,
and the controller's rule "E / cost > 1" becomes exactly the rule above. Alone (R = N = 0) ρ = 1 and
c_v' = c_v: the solo controller. As the batch grows, ρ grows (more tokens per step) faster than the
rows' marginal cost falls, so speculation shrinks and turns off where extra rows would slow the batch
more than they speed this sequence.

Why not the marginal price of a plain row, (c_v(R + S) − c_v(R)) / (c_v(R + 1) − c_v(R)): that compares
this sequence's rows with rows the batch could spend elsewhere, but a batch has no other use for them
(every sequence already has its row); where c_v is nearly flat in S (weight-bound), that view would
make a K-row draft cost K plain steps and turn speculation off even where it raises the batch's
throughput.

Beyond the curve's measured reach c_v grows proportionally (CvCurve.wide): a pessimistic reading for
wide batches. Pure arithmetic on Costs: never reads a clock or a model.
"""

from __future__ import annotations

from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.types import MAX_K


def batch_view(costs: Costs, rows: int, tokens: int, width: int = MAX_K + 1) -> Costs:
    """`costs` as one sequence's rows see them on top of `rows` other rows that emit `tokens` tokens
    this step, for rounds of up to `width` rows (K + 1); `costs` itself when the sequence is alone
    (rows == 0)."""
    if rows < 0 or tokens < 0:
        raise ValueError(f"a batch view needs rows >= 0 and tokens >= 0, got {rows}, {tokens}")
    if rows == 0:
        return costs
    cv = costs.cv
    assert isinstance(cv, CvCurve)
    one = cv.wide(rows + 1)
    rate = (tokens + 1) / one
    points: dict[int, float] = {}
    top = 1.0
    for s in range(1, max(2, width) + 1):   # a noisy curve made monotone
        top = max(top, 1.0 + rate * (cv.wide(rows + s) - one))
        points[s] = top
    return Costs(cv=CvCurve.measured(points, source=f"batch view: {rows} rows, {tokens} tokens"),
                 draft_cost={d: rate * c for d, c in costs.draft_cost.items()},
                 round_overhead=rate * costs.round_overhead, step_ms=costs.step_ms)

"""Map a request's speculative mode onto a controller for the engine's per-round choices.

"off" gives a controller with no drafter (every round plain decoding); a single drafter ("ngram",
"draft") gives the cost-model controller over that drafter with K up to the request's K (it picks K
each round and switches drafting off when acceptance falls below break-even, re-probing now and
then); "auto" gives the same controller over every drafter available. A drafter that proposes
token trees (prompt lookup's ngram-tree) is named to the controller as one, so that it prices its rounds
by its own trees' acceptance. The decisions live in decoding/controller.py; this module only configures it.
"""

from __future__ import annotations

from speczoo.request import GenerationRequest
from speczoo.decoding.controller import Controller
from speczoo.decoding.pricing.cost import Costs
from speczoo.decoding.drafters.base import Drafter


def make_policy(req: GenerationRequest, drafters: dict[str, Drafter], costs: Costs | None) -> Controller:
    """drafters: this request's drafters by name (their situation priors seed the estimates).
    costs None (engines on oracle models, in tests): verify as cheap as a step, drafts free.
    Measured costs must name every drafter; the controller says which one is missing."""
    if costs is None:
        costs = Costs(cv=1.0, draft_cost={d: 0.0 for d in drafters}, round_overhead=0.0)
    priors = {name: d.situation_priors for name, d in drafters.items()}
    confident = {name for name, d in drafters.items() if d.stops_on_confidence}
    trees = {name for name, d in drafters.items() if d.drafts_trees}
    return Controller(costs, list(drafters), k_max=req.k, priors=priors, confident=confident, trees=trees)

"""speczoo.decoding.pricing: what a round costs, in target decode steps, for the controller's choices.

The words:
  target step  one plain greedy decode step of the target: the unit every cost is in (1.0).
  c_v(S)       the cost of one target forward over S rows relative to a step (a verify over [a0] + K
               draft tokens is S = K + 1); a measured curve (CvCurve) or a constant.
  draft cost   a drafter's cost per proposed token (prompt lookup: 0; a draft model: its step relative to
               the target's). Each drafter's price comes with its descriptor (decoding/drafters/registry.py).
  round overhead  the fixed cost of a round outside the target forward (bookkeeping, the lookup, the
               verify's argmax).
  E(α, K)      the tokens a round of K draft tokens emits on average when each is accepted with
               probability α given the ones before it.
  profile      the c_v curve and decode step measured at a model's first load and stored in its bundle.
  calibration  the profile re-expressed at the machine's present speed from the engine's own timings.
  batch view   the costs as one sequence's rows see them on top of the other rows of a batched forward.
cost.py is the arithmetic (E, speedup, best K, break-even α; Costs); profile.py measures c_v; calibrate.py
keeps it current (CostMeter); batch_view.py prices a round inside a batch. How long and how often each
measures: Pricing (decoding/tuning.py).
"""

"""speczoo.decoding.verify: the target's verdict on a draft, for chains and trees, greedy and sampled.

The words, as used here and by the engine:
  a0        the pending token: the target's own pick from the last round (or the prefill), certain but
            not yet emitted; every verify forward starts from it.
  draft     K tokens a drafter proposes after a0: a chain d[0..K-1], or a token tree of N nodes
            (Draft.parents: each node's parent, -1 for a0; tree.py).
  rows      the verify forward runs the target over [a0] + draft (S = K + 1 rows; a tree: N + 1 rows with
            the tree attention mask). Row i holds the target's prediction for the token after the row's
            path: chain token d[i] is checked against row i (row 0: the token after a0), a tree node
            against its parent's row.
  accepted  the draft tokens kept: a prefix of a chain, a root path of a tree (Verdict.accepted, .path).
  correction, bonus
            the one token the target adds itself each round (Verdict.next_token): at the first rejected
            row (the correction), or after the last accepted token when nothing was rejected (the bonus).
            It becomes the next round's a0.
  judged    the draft tokens the target ruled on: the accepted ones plus the first miss (a chain of K:
            all K); what the controller's acceptance estimate counts.
Greedy verification keeps exactly plain greedy decoding's tokens (greedy.py); rejection sampling keeps
the target's distribution exactly (rejection.py). judge.py picks the rule for a round; tree.py lays a
tree out as one forward's rows. Everything here is pure: no model, no cache, no clock.
"""

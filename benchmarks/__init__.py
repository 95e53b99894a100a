"""benchmarks: research scripts outside the product package, each run from the repository root as
`python -m benchmarks.NAME` (replays, drafter comparisons, kernel and EAGLE timings).

They sit above every layer of speczoo and may import any of it; nothing in speczoo ever imports them.
A measurement a user is shown comes from a `speczoo` command, not from here."""

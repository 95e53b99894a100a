"""Drafter descriptors for the engines of tests: the factories a test builds, offered as descriptors.

`offered({"ngram": factory, ...})` gives each name the facts of the built-in drafter of that name
(decoding/drafters/registry.py: batchable, shared cache, what its NAME names) with the test's factory and
no price (a test prices through the engine's Costs), and lets `auto` pick every one of them unless
`auto_excludes` names it, so a test's `auto` runs over all the drafters it built. A name that is not a
built-in drafter's gets a plain descriptor (auto, not batchable). Imported by test files, never a test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from speczoo.decoding.drafters.registry import BY_NAME, DrafterSpec, Factory


def offered(factories: Mapping[str, Factory], auto_excludes: frozenset[str] = frozenset()) -> list[DrafterSpec]:
    specs = []
    for name, factory in factories.items():
        base = BY_NAME.get(name, DrafterSpec(name))
        specs.append(dataclasses.replace(base, factory=factory, cost=None, load=None,
                                         auto=name not in auto_excludes))
    return specs

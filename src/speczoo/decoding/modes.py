"""Speculative modes: the one parser of a `--spec` value (and of a request's `speculative` field).

A mode is "off" (plain decoding), "auto" (the controller chooses among every drafter offered that `auto`
may pick, round by round) or one drafter's name; a drafter whose descriptor `takes_name` may name what it
drafts with: `draft:NAME` (a draft model of the zoo), `eagle:NAME` and `eagle-tree:NAME` (an EAGLE head,
installed or a directory). Every command, the server and the engine read a mode through
`SpecMode.parse`; the facts about each drafter come from its descriptor (decoding/drafters/registry.py),
those of the drafters a loaded engine offers from its own (`offered`), never from a list kept here.
Pure strings and descriptors: this module never loads or looks up a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from speczoo.decoding.drafters.registry import BUILTIN, BY_NAME, DRAFT_MODEL, EAGLE_HEAD, DrafterSpec

OFF = "off"
AUTO = "auto"
MODES = (OFF, *(s.name for s in BUILTIN), AUTO)          # the built-in modes, in the order the API publishes


@dataclass(frozen=True)
class SpecMode:
    mode: str                   # "off", "auto" or a drafter's name
    name: str | None = None     # what MODE:NAME names (a draft model, an EAGLE head)
    takes: str | None = None    # what a NAME names for this mode (its descriptor's takes_name)

    @classmethod
    def parse(cls, text: str, offered: Mapping[str, DrafterSpec] | None = None) -> SpecMode:
        """`text` as a mode: "off", "auto", a drafter's name, or MODE:NAME for a drafter that takes a
        name. `offered` is the drafters a loaded engine offers, by name (default: the built-in ones); a
        mode outside them is a ValueError listing the choices."""
        mode, sep, name = text.partition(":")
        specs = BY_NAME if offered is None else offered
        if mode not in (OFF, AUTO, *specs):
            if offered is None:
                raise ValueError(f"unknown speculative mode {text!r}: choose one of {choices(BY_NAME)}")
            raise ValueError(f"speculative mode {text!r} is not available here; choose one of {choices(offered)}")
        spec = specs.get(mode)
        takes = spec.takes_name if spec is not None else None
        if sep and takes is None:
            named = [s.name + ":NAME" for s in specs.values() if s.takes_name]
            raise ValueError(f"speculative mode {mode!r} takes no name (got {text!r}); only {', '.join(named)} do")
        if sep and not name:
            raise ValueError(f"speculative mode {text!r} names nothing after ':'; give {mode}:NAME or {mode}")
        return cls(mode, name or None, takes)

    def __str__(self) -> str:
        return f"{self.mode}:{self.name}" if self.name else self.mode

    @property
    def draft_model(self) -> str | None:
        """The draft model a `MODE:NAME` names (`draft:NAME`), else None."""
        return self.name if self.takes == DRAFT_MODEL else None

    @property
    def eagle_head(self) -> str | None:
        """The EAGLE head a `MODE:NAME` names (`eagle:NAME`, `eagle-tree:NAME`), else None."""
        return self.name if self.takes == EAGLE_HEAD else None


def choices(drafters: Mapping[str, DrafterSpec]) -> str:
    """The modes a set of drafters allows, for an error message: off, each drafter, auto, MODE:NAME."""
    named = [f"{n}:NAME" for n, s in drafters.items() if s.takes_name]
    return ", ".join([OFF, *drafters, AUTO, *named])


def using(takes_name: str) -> tuple[str, ...]:
    """The built-in modes that may draft with what `takes_name` names (a draft model: "draft", and "auto"
    when `auto` may pick it), so a command knows to load one."""
    modes = [s.name for s in BUILTIN if s.takes_name == takes_name]
    auto = any(s.auto for s in BUILTIN if s.takes_name == takes_name)
    return (*modes, AUTO) if auto else tuple(modes)

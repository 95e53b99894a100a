"""Speculative modes: the one parser of a `--spec` value (and of a request's `speculative` field).

A mode is "off" (plain decoding), "auto" (the controller chooses among every drafter offered, round by
round) or one drafter's name. Three drafters may name what they draft with: `draft:NAME` (a draft
model from the zoo), `eagle:NAME` and `eagle-tree:NAME` (an EAGLE head, installed or a directory).
Every command, the server and the runtime read a mode through `SpecMode.parse`. Whether a loaded
runtime offers the drafter is checked against the names it offers (`offered`), never guessed here.
Pure strings: this module never loads or looks up a model.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

OFF = "off"
AUTO = "auto"
DRAFTERS = ("ngram", "ngram-tree", "draft", "eagle", "eagle-tree")    # the built-in drafters
MODES = (OFF, *DRAFTERS, AUTO)                                          # in the order the API publishes
EAGLE_MODES = ("eagle", "eagle-tree")
NAMED = ("draft", *EAGLE_MODES)                                         # the modes that may carry ":NAME"


@dataclass(frozen=True)
class SpecMode:
    mode: str                   # "off", "auto" or a drafter's name
    name: str | None = None     # the draft model (draft:NAME) or EAGLE head (eagle[-tree]:NAME) named

    @classmethod
    def parse(cls, text: str, offered: Collection[str] | None = None) -> SpecMode:
        """`text` as a mode: "off", "auto", a drafter's name, or `draft:NAME` / `eagle:NAME` /
        `eagle-tree:NAME`. `offered` is the drafters a loaded engine offers (default: the built-in
        ones); a mode outside them is a ValueError listing the choices."""
        mode, sep, name = text.partition(":")
        if offered is None:
            if mode not in MODES:
                raise ValueError(f"unknown speculative mode {text!r}: choose one of {choices(DRAFTERS)}")
        elif mode not in (OFF, AUTO, *offered):
            raise ValueError(f"speculative mode {text!r} is not available here; choose one of {choices(offered)}")
        if sep and mode not in NAMED:
            raise ValueError(f"speculative mode {mode!r} takes no name (got {text!r}); only "
                             f"{', '.join(m + ':NAME' for m in NAMED)} do")
        if sep and not name:
            raise ValueError(f"speculative mode {text!r} names nothing after ':'; give {mode}:NAME or {mode}")
        return cls(mode, name or None)

    def __str__(self) -> str:
        return f"{self.mode}:{self.name}" if self.name else self.mode

    @property
    def draft_model(self) -> str | None:
        """The draft model `draft:NAME` names, else None."""
        return self.name if self.mode == "draft" else None

    @property
    def eagle_head(self) -> str | None:
        """The EAGLE head `eagle:NAME` or `eagle-tree:NAME` names, else None."""
        return self.name if self.mode in EAGLE_MODES else None


def choices(drafters: Collection[str]) -> str:
    """The modes a set of drafters allows, for an error message: off, each drafter, auto."""
    named = [f"{m}:NAME" for m in NAMED if m in drafters]
    return ", ".join([OFF, *(d for d in drafters if d not in (OFF, AUTO)), AUTO, *named])

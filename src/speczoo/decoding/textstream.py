"""Turn a growing list of output ids into safe text deltas, honouring stop strings.

Emits text only when it is final: never half a UTF-8 character (a trailing U+FFFD from an incomplete
byte sequence is held back) and never the beginning of a stop string that may still complete. Knows
nothing about models; it only calls `tokenizer.decode`.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.ids: list[int] = []
        self.text = ""          # decoded text of all ids (may end mid-character)
        self.emitted = 0        # characters of `text` already handed out
        self.stopped = False    # a stop string was found; `final_text` ends before it

    def _hold_back(self, text: str) -> int:
        """How many trailing characters must wait: an incomplete character or a stop-string prefix."""
        hold = 0
        if text.endswith("\ufffd"):
            hold = len(text) - len(text.rstrip("\ufffd"))
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold

    def push(self, ids: list[int]) -> str:
        """Add ids; return the new final text (may be empty). Sets `stopped` on a stop string."""
        self.ids.extend(ids)
        self.text = self.tokenizer.decode(self.ids)
        cut = len(self.text)
        for s in self.stop:
            at = self.text.find(s, max(0, self.emitted - len(s) + 1))
            if at != -1 and at < cut:
                cut = at
                self.stopped = True
        if self.stopped:
            self.text = self.text[:cut]
            delta = self.text[self.emitted:]
        else:
            delta = self.text[self.emitted:len(self.text) - self._hold_back(self.text)]
        self.emitted += len(delta)
        return delta

    def flush(self) -> str:
        """At the end of generation: whatever was held back (except a stop string) is final."""
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta

"""Turn a generation's output ids, a round at a time, into safe text deltas, honouring stop strings.

Emits text only when it is final: never half a UTF-8 character (the tokenizer's IncrementalDecoder holds
an incomplete byte sequence back until the ids that finish it arrive) and never the beginning of a stop
string that may still complete. Each id is decoded once. Knows nothing about models or the engine.
"""

from __future__ import annotations


class TextStream:
    """tokenizer: anything with `incremental_decoder()` (speczoo.tokenizer.Tokenizer)."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self._decoder = tokenizer.incremental_decoder()
        self.stop = [s for s in (stop or []) if s]
        self.text = ""          # the text of every id so far (a stop string and what follows cut off)
        self.emitted = 0        # characters of `text` already handed out
        self.stopped = False    # a stop string was found; `text` ends before it

    def _hold_back(self, text: str) -> int:
        """How many trailing characters must wait: the longest stop-string prefix the text ends with."""
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold

    def push(self, ids: list[int]) -> str:
        """Add ids; return the new final text (may be empty). Sets `stopped` on a stop string."""
        piece = self._decoder.feed(ids)
        if not piece:
            return ""
        self.text += piece
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
        """At the end of generation: whatever was held back (except a stop string) is final; a character
        the ids never finished shows as U+FFFD."""
        if not self.stopped:
            self.text += self._decoder.flush()
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta

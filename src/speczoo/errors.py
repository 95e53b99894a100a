"""Errors a user can act on. Each message says what happened and what to do next."""


class SpeczooError(Exception):
    """Base of user-facing errors; the CLI prints the message without a traceback."""


class UnknownModelError(SpeczooError, KeyError):
    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class IntegrityError(SpeczooError):
    """A downloaded or assembled file does not match its pinned sha256."""


class CacheFullError(SpeczooError):
    """Prompt plus generation would exceed the KV cache (--max-seq)."""


class NotPulledError(SpeczooError):
    """A model is known to the zoo but has no bundle on disk yet."""

"""The `openai` client's side of the server tests: the API key the test servers require and a chat call.
Imported by test files (test_serve_openai.py, test_serve_batch.py), never a test itself."""

from __future__ import annotations

KEY = "test-key"


def chat(client, runtime, text, **kw):
    """One user message to `runtime`'s model through the `openai` client (its other arguments as keywords)."""
    return client.chat.completions.create(model=runtime.name, messages=[{"role": "user", "content": text}],
                                          **kw)

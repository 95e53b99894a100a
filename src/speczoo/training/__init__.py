"""speczoo.training: training what the runtime drafts with, kept apart from inference.

It sits above decoding, zoo and runtime and may import them; nothing in decoding, zoo or runtime ever
imports it (an inference path never needs a training module)."""

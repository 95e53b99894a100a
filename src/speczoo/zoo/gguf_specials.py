"""Which tokens of a GGUF vocabulary llama.cpp treats as special, and which end a generation: data only.

A GGUF marks special tokens by type (CONTROL, USER_DEFINED, UNKNOWN) and names bos/eos/eot/eom by id, but
llama.cpp (llama_vocab::impl::load) also recognises tokens by their text: the end-of-generation tokens
(Llama 3's <|eot_id|>, ChatML's <|im_end|>, Gemma's <end_of_turn> ...) become control tokens whatever
type the file gave them, and the fill-in-the-middle pad/repo/file-separator tokens end a generation too.
Phi-3 files get their special tokens right-stripped. `zoo.gguf_tokenizer` reads this table; this module
holds no logic beyond these lookups and never reads a file.
"""

from __future__ import annotations

import gguf

# llama.cpp token types (gguf.TokenType) that it keeps whole in the text (its special-token cache).
UNKNOWN = int(gguf.TokenType.UNKNOWN)            # 2: special
CONTROL = int(gguf.TokenType.CONTROL)            # 3: special, matched whole, skipped by skip_special
USER_DEFINED = int(gguf.TokenType.USER_DEFINED)  # 4: matched whole, decoded as text

# Texts that end a generation in llama.cpp (its special_eog_ids), whatever the file's type for them.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")
# Fill-in-the-middle tokens llama.cpp also stops on: pad, repository name, file separator.
FIM_EOG_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
                 "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                 "<|file_sep|>")
# The other fill-in-the-middle tokens (prefix, suffix, middle): control tokens, but not an end.
FIM_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
             "<|code_prefix|>", "<|prefix|>",
             "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
             "<|code_suffix|>", "<|suffix|>",
             "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
             "<|code_middle|>", "<|middle|>")
# The harmony and solar-open vocabularies: with both markers present, <|end|> ends a message, not a generation.
END_IS_NOT_EOG_WITH = (("<|return|>", "<|call|>"), ("<|calls|>", "<|flush|>"))
# A normal </s> (gemma4, plamo): with one of these present, </s> is not an end of generation.
S_IS_NORMAL_WITH = ("<|tool_response>", "<|plamo:eos|>")

# general.name fragments (lowercased) whose special tokens llama.cpp right-strips, and the exceptions.
RSTRIP_MODEL_NAMES = ("phi-3", "phi3")
RSTRIP_NOT = ("<unk>", "<s>", "<|endoftext|>")


def eog_texts(vocab: set[str]) -> list[str]:
    """The texts of `vocab` that end a generation, with llama.cpp's two exceptions applied."""
    found = [t for t in (*EOG_TEXTS, *FIM_EOG_TEXTS) if t in vocab]
    if any(a in vocab and b in vocab for a, b in END_IS_NOT_EOG_WITH):
        found = [t for t in found if t != "<|end|>"]
    if any(t in vocab for t in S_IS_NORMAL_WITH):
        found = [t for t in found if t != "</s>"]
    return found


def control_texts(vocab: set[str]) -> list[str]:
    """The texts of `vocab` llama.cpp makes control tokens whatever their type: the ends and the FIM tokens."""
    return [t for t in (*EOG_TEXTS, *FIM_EOG_TEXTS, *FIM_TEXTS) if t in vocab]


def rstrips(model_name: str | None, text: str) -> bool:
    """Whether llama.cpp strips the whitespace after special token `text` in a model called `model_name`."""
    name = (model_name or "").lower()
    if not any(n in name for n in RSTRIP_MODEL_NAMES):
        return False
    return text not in RSTRIP_NOT

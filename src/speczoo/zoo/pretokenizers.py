"""How llama.cpp splits text into words before byte-level BPE, per `tokenizer.ggml.pre` name: one table.

A byte-level BPE GGUF (`tokenizer.ggml.model == "gpt2"`) names its pre-tokenizer; llama.cpp maps that
name to a list of regexes (src/llama-vocab.cpp, `LLAMA_VOCAB_PRE_TYPE_*`) applied one after the other,
each isolating its matches inside the pieces the previous one left, plus a few per-name flags. This
module holds that mapping as data, in the regex dialect `tokenizers.Regex` (Oniguruma) reads, so that
`zoo.gguf_tokenizer` builds one `pre_tokenizers.Split` per regex. The regexes are llama.cpp's own
(its adaptations of each model's tokenizer.json pattern), since the ids must equal llama.cpp's.

It holds no code paths per name and never guesses: a name missing here is unsupported, and
`pre_tokenizer_for` says which names are known. Names llama.cpp serves with hand-written splitters
(kimi-k2, afmoe, tiny_aya's digit groups, superbpe) or without byte-level encoding (gemma4, sarvam-moe,
mmbert, whitespace) and encoder-only vocabularies (jina, roberta, granite-embed) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

# The contractions, as llama.cpp writes GPT-4-style patterns (case-insensitive without an inline flag).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"\s*[\r\n]+|\s+(?!\S)|\s+"     # newline runs, then whitespace not followed by a word, then the rest

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL
# Letters as "upper-or-other then lower" runs; llama.cpp spells \p{Lu}/\p{Ll} with lookaheads and [^a-z].
_UPPER_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+%s"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*%s")
_CJK_DEEPSEEK = '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+'
_CJK_KANA = '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+'
_PUNCT_WORDS = ('[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+'
                '| ?[\\p{P}\\p{S}]+')

# llama.cpp pre-tokenizer type -> its regexes, applied in order.
SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (GPT2,),
    "starcoder": (r"\p{N}", GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
              r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "qwen2": (QWEN2,),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|" + _TAIL,),
    "deepseek-llm": (
        r"[\r\n]",
        "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376"
        "\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
        "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
        "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f"
        "-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
        "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
        "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
        "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
        "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
        "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
        r"\s+$",
        _CJK_DEEPSEEK,
        r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_DEEPSEEK, r"\p{N}"),
    "deepseek-v3": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORDS + "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORDS + "|[\r\n]|\\s+(?!\\S)|\\s+", r"\p{N}"),
    "youtu": ('[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f'
              '\ufe30-\ufe4f]+|[\u3105-\u312f]+|' + _CJK_KANA,
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
              + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS
              + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL),
    "bloom": (' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+',),
    "viking": (' ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+', r"\p{N}"),
    "tekken": (_UPPER_LOWER % ("", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL,),
    "gpt-4o": (_UPPER_LOWER % (_CONTRACTIONS + "?", _CONTRACTIONS + "?")
               + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL,),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|" + _TAIL,),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL,),
    "laguna": (r"[^\n]+|[\n]+", QWEN2),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL),
}


@dataclass(frozen=True)
class PreTokenizer:
    """What one `tokenizer.ggml.pre` name means to llama.cpp."""

    splits: str                  # a key of SPLITS
    ignore_merges: bool = False  # a word that is itself a token is taken whole, before any merge
    add_bos: bool = False        # BOS is added when the file has no tokenizer.ggml.add_bos_token


_L3 = PreTokenizer("llama3", ignore_merges=True, add_bos=True)

# tokenizer.ggml.pre -> llama.cpp's treatment (llama_vocab::impl::load).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer("default"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _L3),
    "dbrx": PreTokenizer("llama3"),
    "smaug-bpe": PreTokenizer("llama3"),
    "chatglm-bpe": PreTokenizer("llama3"),
    "glm4": PreTokenizer("llama3", ignore_merges=True),
    "glm5": PreTokenizer("llama3", ignore_merges=True),
    "jais-2": PreTokenizer("jais2"),
    "deepseek-llm": PreTokenizer("deepseek-llm"),
    "deepseek-coder": PreTokenizer("deepseek-coder"),
    "deepseek-v3": PreTokenizer("deepseek-v3"),
    "hunyuan-dense": PreTokenizer("deepseek-v3"),
    "joyai-llm": PreTokenizer("deepseek-v3"),
    "hy_v4": PreTokenizer("deepseek-v3"),
    "spark2_5": PreTokenizer("spark2_5"),
    "youtu": PreTokenizer("youtu", ignore_merges=True),
    "falcon": PreTokenizer("falcon"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    PreTokenizer("starcoder")),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "gigachat", "a.x-4.0",
                     "mellum", "exaone4"), PreTokenizer("gpt2")),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
                     "grok-2"), PreTokenizer("qwen2")),
    "qwen35": PreTokenizer("qwen35"),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizer("bloom")),
    "viking": PreTokenizer("viking"),
    "tekken": PreTokenizer("tekken", ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreTokenizer("gpt-4o")),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizer("bailingmoe")),
    "seed-coder": PreTokenizer("seed-coder"),
    "ufakzeka": PreTokenizer("ufakzeka"),
    "laguna": PreTokenizer("laguna"),
    "exaone-moe": PreTokenizer("exaone-moe"),
    "minicpm5": PreTokenizer("minicpm5", ignore_merges=True),
}


def pre_tokenizer_for(name: str | None) -> PreTokenizer:
    """llama.cpp's treatment of `tokenizer.ggml.pre` == name (None: the key is absent, llama.cpp's "default")."""
    pre = PRE_TOKENIZERS.get("default" if name is None else name)
    if pre is None:
        raise ValueError(f"GGUF pre-tokenizer {name!r} is not supported; speczoo knows {sorted(PRE_TOKENIZERS)}")
    return pre

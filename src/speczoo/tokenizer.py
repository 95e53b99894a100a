"""The tokenizer of a bundle: text <-> ids, the chat template, and a UTF-8-safe incremental decoder.

A bundle stores tokenizer.json (a `tokenizers` file, built at pull time from GGUF metadata by
`zoo.gguf_tokenizer` or copied from a Hugging Face directory), tokenizer_config.json (special ids, add_bos,
how ids map to bytes) and chat_template.jinja. This module only reads them; it never builds a vocabulary
and never guesses a missing special token or chat template: a missing one is an error that says what to do.
It sits below the zoo, which builds these files (`zoo.gguf_tokenizer.read_tokenizer` builds a Tokenizer
straight from a GGUF): it never imports the zoo.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from speczoo.errors import SpeczooError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
BYTE_DECODINGS = ("byte_level", "byte_fallback")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


# Chat templates speczoo supplies for models whose file carries none or one that cannot render, by name.
BUILTIN_CHAT_TEMPLATES = {
    # Gemma's turn format: a system message is folded into the first user turn; the assistant is "model".
    "gemma": (
        "{{ bos_token }}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
        "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
        "{%- for m in turns -%}"
        "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif -%}"
        "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
        "{{ (prefix if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
    ),
    # ChatML (Qwen, SmolLM2, many fine-tunes): every turn in <|im_start|>role ... <|im_end|>.
    "chatml": (
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
    ),
    # Llama 3's header format; BOS first, as its own templates write it.
    "llama3": (
        "{{ bos_token }}{%- for m in messages -%}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + (m['content'] | trim) + '<|eot_id|>' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif -%}"
    ),
}
# The special token that shows a vocabulary was trained on a builtin template's format, in order of trust.
BUILTIN_TEMPLATE_MARKERS = (("<start_of_turn>", "gemma"), ("<|start_header_id|>", "llama3"), ("<|im_start|>", "chatml"))
# Conversations a chat template must render at least one of (some templates demand a system turn).
TEMPLATE_PROBES = ([{"role": "user", "content": "Hello"}],
                   [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])


class ChatTemplateError(SpeczooError, TemplateError):
    """The model's chat template rejects a conversation or cannot render (a SpeczooError: callers show it)."""


class _Raised(TemplateError):
    """raise_exception() in a template: the template's own refusal of the conversation."""


class _GenerationTag(Extension):
    """HF's {% generation %}...{% endgeneration %} (it marks the assistant's text for training masks):
    rendered as its body, as transformers renders it."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF's `tojson`: unlike jinja2's own, it does not HTML-escape and keeps non-ASCII text."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise _Raised(message)


def chat_environment() -> ImmutableSandboxedEnvironment:
    """The sandboxed jinja2 environment chat templates run in, with the helpers HF templates expect."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _text_content(content) -> str:
    """A message's content as text: a string, or the text parts of an OpenAI-style list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ValueError("only text message parts are supported (type 'text')")
        return "".join(p.get("text", "") for p in content)
    if content is None:
        return ""
    raise ValueError(f"message content must be a string or a list of text parts, not {type(content).__name__}")


class Tokenizer:
    """Text <-> ids for one model, with its special ids and chat template."""

    def __init__(self, backend: Backend, config: dict, chat_template: str | None = None):
        missing = {"bos_id", "eos_ids", "add_bos_token", "byte_decoding"} - set(config)
        if missing:
            raise SpeczooError(f"tokenizer_config.json lacks {sorted(missing)}: it was not written by speczoo's "
                               "pull; re-pull the model with `speczoo pull NAME --force`")
        if config["byte_decoding"] not in BYTE_DECODINGS:
            raise SpeczooError(f"unknown byte_decoding {config['byte_decoding']!r}; expected one of {BYTE_DECODINGS}")
        self.backend = backend
        self.config = config
        self.chat_template = chat_template
        self._compiled = None
        self._pieces: dict[int, bytes] = {}        # id -> its bytes (piece_bytes), filled as ids are seen
        self.bos_id: int | None = config["bos_id"]
        self.eos_ids: list[int] = list(config["eos_ids"])
        self.add_bos: bool = bool(config["add_bos_token"])
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_bundle(cls, bundle_dir: Path) -> Tokenizer:
        bundle_dir = Path(bundle_dir)
        tok_file, cfg_file = bundle_dir / TOKENIZER_FILE, bundle_dir / CONFIG_FILE
        for f in (tok_file, cfg_file):
            if not f.is_file():
                raise FileNotFoundError(f"{f} is missing: {bundle_dir} is not a complete bundle; re-pull the model")
        template_file = bundle_dir / CHAT_TEMPLATE_FILE
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
        return cls(Backend.from_file(str(tok_file)), json.loads(cfg_file.read_text()), template)

    def save(self, bundle_dir: Path) -> None:
        """Write tokenizer.json, tokenizer_config.json and (when there is one) chat_template.jinja."""
        bundle_dir = Path(bundle_dir)
        self.backend.save(str(bundle_dir / TOKENIZER_FILE))
        (bundle_dir / CONFIG_FILE).write_text(json.dumps(self.config, indent=2, ensure_ascii=False))
        if self.chat_template is not None:
            (bundle_dir / CHAT_TEMPLATE_FILE).write_text(self.chat_template, encoding="utf-8")

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Ids of `text`; add_special adds what the model's file asks for (BOS for Gemma, nothing for Qwen)."""
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, **extra) -> str:
        """The conversation rendered as the model's prompt text (encode it with add_special=False)."""
        if self.chat_template is None:
            raise SpeczooError("this model has no chat template (its file carries none and the zoo names none); "
                               "send a plain completion prompt instead of chat messages")
        msgs = [dict(m, content=_text_content(m.get("content"))) for m in messages]
        for m in msgs:
            if "role" not in m:
                raise ValueError(f"every chat message needs a 'role'; got {sorted(m)}")
        specials = {k: self.config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        try:
            return self._template().render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                           tools=tools, **specials, **extra)
        except _Raised as exc:
            raise ChatTemplateError(f"the model's chat template rejects this conversation: {exc}") from exc
        except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            raise ChatTemplateError(f"the model's chat template failed to render ({type(exc).__name__}: {exc}); "
                                    "it may use a feature speczoo's jinja2 sandbox lacks: send a plain completion "
                                    "prompt instead, or pull the model from a GGUF whose template renders") from exc

    def chat_template_problem(self) -> str | None:
        """Why the chat template cannot render even a one-message chat (None when it renders one of
        TEMPLATE_PROBES): what a pull checks before it keeps a template."""
        first = None
        for probe in TEMPLATE_PROBES:
            try:
                self.apply_chat_template(probe)
                return None
            except ChatTemplateError as exc:
                first = first or str(exc)
        return first

    def builtin_template_name(self) -> str | None:
        """The builtin template whose turn markers this vocabulary holds (None: none of them)."""
        return next((name for marker, name in BUILTIN_TEMPLATE_MARKERS
                     if self.backend.token_to_id(marker) is not None), None)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """The conversation's prompt ids: rendered through the chat template with the generation prompt
        appended, then encoded (no extra special tokens: the template writes its own)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=True))

    def _template(self):
        """The compiled chat template (recompiled when `chat_template` was replaced)."""
        if self._compiled is None or self._compiled[0] != self.chat_template:
            try:
                compiled = chat_environment().from_string(self.chat_template)
            except TemplateError as exc:
                raise ChatTemplateError(f"the model's chat template is not valid jinja for speczoo "
                                        f"({type(exc).__name__}: {exc}): send a plain completion prompt instead, "
                                        "or pull the model from a GGUF whose template compiles") from exc
            self._compiled = (self.chat_template, compiled)
        return self._compiled[1]

    @cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    @cached_property
    def _byte_of(self) -> dict[str, int]:
        """A byte-level piece's characters -> the bytes they stand for."""
        return {c: b for b, c in byte_alphabet().items()}

    def piece_bytes(self, i: int) -> bytes:
        """The bytes id `i` decodes to (a special token as its text), for incremental decoding: worked
        out on first use and kept, so that the first generation does not pay for the whole vocabulary."""
        out = self._pieces.get(i)
        if out is not None:
            return out
        piece = self.backend.id_to_token(i) or ""
        if self.config["byte_decoding"] == "byte_level":
            inverse = self._byte_of
            out = b"".join(bytes([inverse[c]]) if c in inverse else c.encode("utf-8") for c in piece)
        else:
            m = _BYTE_PIECE.match(piece)
            out = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        self._pieces[i] = out
        return out

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special)


class IncrementalDecoder:
    """Feed ids one or a few at a time; get back only completed text, never half a UTF-8 character.

    Works on bytes: each id maps to the bytes it stands for (a byte-level BPE piece or a byte-fallback
    "<0xAB>" piece may hold part of a character), and a UTF-8 decoder holds back an incomplete tail
    until the ids that finish it arrive. The concatenated output equals `Tokenizer.decode` of all ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._bytes = tokenizer.piece_bytes
        self._skip = tokenizer.special_ids if skip_special else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: int | Iterable[int]) -> str:
        ids = [ids] if isinstance(ids, int) else ids
        data = b"".join(self._bytes(i) for i in ids if i not in self._skip)
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is held back, with U+FFFD for a character the ids never finished."""
        return self._utf8.decode(b"", final=True)

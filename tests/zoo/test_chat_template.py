"""The chat template comes from the file, renders as transformers renders it, and a template that cannot
render is never passed over silently: a pull falls back to a builtin with a warning (or keeps it with a
warning when speczoo has none), and a chat request gets a SpeczooError that says what failed.
"""

from __future__ import annotations

import io
import types

import pytest
from jinja2.exceptions import TemplateError
from real_ggufs import NAMES, real_gguf
from tiny_gguf import CHATML, write_tiny_gguf
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from fake_runtime import make_test_runtime
from speczoo.chat import ChatSession
from speczoo.errors import SpeczooError
from speczoo.tokenizer import BUILTIN_CHAT_TEMPLATES, ChatTemplateError, Tokenizer
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from speczoo.zoo.pull import SourceContent, _chat_template, open_gguf_source

HELLO = [{"role": "user", "content": "Hello"}]
CONVERSATIONS = [
    HELLO,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "日本語で? 😀"}],
]
BROKEN = "{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}"   # compiles nowhere
RAISES = "{{ raise_exception('this template refuses everything') }}"


def _tok(template: str | None, tmp_path) -> Tokenizer:
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2", chat_template=False)
    tok = read_tokenizer(path)
    tok.chat_template = template
    return tok


# ---------------------------------------------------------------- errors say what failed

@pytest.mark.parametrize("template, words", [
    (RAISES, "rejects this conversation: this template refuses everything"),
    (BROKEN, "not valid jinja"),
    ("{{ messages[0]['content'] + 1 }}", "failed to render"),
    ("{{ messages[5]['content'] }}", "failed to render"),
])
def test_a_template_failure_is_a_speczoo_error_saying_what_failed(tmp_path, template, words):
    tok = _tok(template, tmp_path)
    with pytest.raises(ChatTemplateError, match=words) as err:
        tok.apply_chat_template(HELLO)
    assert isinstance(err.value, SpeczooError) and isinstance(err.value, TemplateError)
    assert tok.chat_template_problem() is not None


def test_a_template_needing_a_system_turn_still_renders(tmp_path):
    tok = _tok("{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}ok", tmp_path)
    assert tok.chat_template_problem() is None


def test_the_generation_tag_renders_its_body(tmp_path):
    """HF's {% generation %} (assistant masks) is accepted and renders as transformers renders it."""
    tok = _tok("{% for m in messages %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}", tmp_path)
    assert tok.apply_chat_template(CONVERSATIONS[1]) == "[Be brief.][Hi there][Hello!][日本語で? 😀]"


def test_the_chat_reports_a_template_error_and_goes_on():
    rt = make_test_runtime()

    def refuse(messages, add_generation_prompt=True):
        raise ChatTemplateError("the model's chat template rejects this conversation: no")

    rt.tokenizer.apply_chat_template = refuse
    out = io.StringIO()
    s = ChatSession(rt, out=out, spec="off", max_tokens=5)
    s.feed(["hi", "/stats"])
    assert "[error: the model's chat template rejects this conversation: no]" in out.getvalue()
    assert s.messages == []


# ---------------------------------------------------------------- what a pull keeps

def _source(tmp_path, arch: str, template: str | bool) -> SourceContent:
    path, _ = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, chat_template=template)
    return open_gguf_source(path, log=lambda m: None)


@pytest.mark.parametrize("arch, builtin", [("qwen2", "chatml"), ("gemma3", "gemma")])
def test_a_template_that_cannot_render_falls_back_with_a_warning(tmp_path, arch, builtin):
    src, logged = _source(tmp_path, arch, BROKEN), []
    assert _chat_template(src, "tiny", None, logged.append) == f"builtin:{builtin}"
    assert src.tokenizer.chat_template == BUILTIN_CHAT_TEMPLATES[builtin]
    assert len(logged) == 1 and "warning" in logged[0] and "not valid jinja" in logged[0] and builtin in logged[0]


def test_a_template_that_renders_is_kept_as_the_file_has_it(tmp_path):
    src, logged = _source(tmp_path, "qwen2", True), []
    assert _chat_template(src, "tiny", None, logged.append) == "gguf"
    assert src.tokenizer.chat_template == CHATML and logged == []


def test_without_a_builtin_a_broken_template_is_kept_with_a_warning():
    backend = Backend(BPE(vocab={"a": 0}, merges=[]))
    tok = Tokenizer(backend, {"bos_id": None, "eos_ids": [0], "add_bos_token": False, "byte_decoding": "byte_level"},
                    RAISES)
    src = SourceContent(args=types.SimpleNamespace(arch="llama"), quantization={}, tokenizer=tok,
                        template_source="gguf", tensor_names=[], tensors=iter(()))
    logged = []
    assert _chat_template(src, "odd", None, logged.append) == "gguf"
    assert tok.chat_template == RAISES
    assert len(logged) == 1 and "chat requests will fail" in logged[0] and "refuses everything" in logged[0]


def test_a_vocabulary_without_a_template_gets_the_builtin_its_markers_name(tmp_path):
    src, logged = _source(tmp_path, "qwen2", False), []
    assert _chat_template(src, "tiny", None, logged.append) == "builtin:chatml"
    assert src.tokenizer.apply_chat_template(HELLO) == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------- the same text as transformers

def _assert_renders_as_transformers(ours: Tokenizer, path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for msgs in CONVERSATIONS:
        for gen in (True, False):
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == ref.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=gen), (msgs, gen)


GENERATION = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% generation %}{{ m['content'] }}"
              "{% endgeneration %}{{ '<|im_end|>\n' }}{% endfor %}")


@pytest.mark.parametrize("template", [True, GENERATION], ids=["chatml", "generation-tag"])
def test_the_tiny_files_template_renders_as_transformers(tmp_path, template):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2", chat_template=template)
    _assert_renders_as_transformers(read_tokenizer(path), path)


@pytest.mark.real
@pytest.mark.parametrize("name", NAMES)
def test_real_files_template_renders_as_transformers(name):
    """Every real file that carries a template (Gemma 3 270M carries none and gets the builtin)."""
    path = real_gguf(name)
    ours = read_tokenizer(path)
    if ours.chat_template is None:
        pytest.skip(f"{path.name} carries no chat template")
    _assert_renders_as_transformers(ours, path)

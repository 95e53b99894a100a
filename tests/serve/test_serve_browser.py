"""The chat page in a real browser (Debian's chromium driven by Playwright) against a real server.

Types a prompt with ⚡Spec off (greedy) and on: the answer is the same both ways and the speed readout
changes (drafter, accepted per round). The stop button cancels a running answer on the server. An answer
in Markdown is rendered (a code fence as a code block with a working copy button), and sanitized. Saves a
screenshot (to $SPECZOO_SCREENSHOT_DIR if set, else the test's tmp dir). Fails, never skips, when
chromium is missing: `apt-get install -y chromium`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from fake_runtime import is_fake, make_test_runtime
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def runtime():
    return make_test_runtime(max_seq=1024, delay=0.004, answer_words=60)


@pytest.fixture(scope="module")
def server(runtime):
    with BackgroundServer(create_app(runtime, default_spec="auto")) as s:
        yield s


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    assert Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} is missing: the browser test needs Debian's chromium "
        "(apt-get update && apt-get install -y chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=ARGS, headless=True,
            viewport={"width": 1100, "height": 800})
        try:
            yield context.new_page()
        finally:
            context.close()


def ask(page, text: str, max_tokens: int = 48) -> tuple[str, dict]:
    """Send `text` through the page's form; wait for the answer; return it and the readout."""
    if not page.get_by_label("Max tokens").is_visible():
        page.get_by_text("Settings").click()
    page.get_by_label("Max tokens").fill(str(max_tokens))
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")
    answer = page.locator(".msg.assistant").last
    expect(answer).to_have_attribute("data-done", "1", timeout=120_000)
    readout = {k: page.locator(f"#{k}").text_content() for k in ("tps", "apr", "rounds", "drafter", "tokens")}
    return answer.locator(".text").text_content(), readout


def shot_dir(tmp_path) -> Path:
    d = Path(os.environ.get("SPECZOO_SCREENSHOT_DIR", tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_greedy_and_spec_give_the_same_answer_and_a_different_readout(page, server, runtime, tmp_path):
    page.goto(server.url + "/")
    expect(page.locator("#model")).to_have_text(runtime.name)
    spec = page.get_by_role("switch")
    expect(spec).to_be_checked()
    # A copying task, so that prompt lookup (n-gram drafting) also hits on a real model.
    prompt = ("Repeat this code exactly, twice:\ndef add(a, b):\n    return a + b\n"
              "def sub(a, b):\n    return a - b")

    spec.uncheck()
    expect(page.locator("#spec-label")).to_have_text("Greedy")
    greedy, r_off = ask(page, prompt)
    assert greedy.strip(), "the greedy answer is empty"
    assert r_off["drafter"] == "off" and float(r_off["apr"]) == 0.0
    page.screenshot(path=str(shot_dir(tmp_path) / "chat-greedy.png"))

    page.get_by_role("button", name="New chat").click()
    expect(page.locator(".msg")).to_have_count(0)
    spec.check()
    expect(page.locator("#spec-label")).to_have_text("⚡Spec")
    fast, r_on = ask(page, prompt)
    assert fast == greedy, "speculative decoding changed the greedy answer"
    assert r_on["drafter"] != "off" and float(r_on["apr"]) > 0.0
    if is_fake(runtime):
        assert int(r_on["rounds"]) < int(r_off["rounds"]), "spec should need fewer target rounds"
    assert r_on["tokens"] == r_off["tokens"]
    assert float(r_on["tps"]) > 0
    # accessibility basics: the answer region announces itself; the controls are labelled
    assert page.locator(".msg.assistant").last.get_attribute("aria-busy") == "false"
    expect(page.locator("#status")).to_have_attribute("aria-live", "polite")
    page.screenshot(path=str(shot_dir(tmp_path) / "chat-spec.png"))


def test_stop_button_cancels_the_generation(page, server, runtime, tmp_path):
    if is_fake(runtime):
        runtime.delay = 0.05
    try:
        page.goto(server.url + "/")
        expect(page.locator("#model")).to_have_text(runtime.name)
        before = httpx.get(server.url + "/health").json()["cancelled"]
        page.get_by_text("Settings").click()
        page.get_by_label("Max tokens").fill("900")
        page.get_by_label("Message").fill("Tell me a very long story.")
        page.get_by_role("button", name="Send").click()
        answer = page.locator(".msg.assistant").last
        expect(answer.locator(".text")).not_to_have_text("", timeout=20_000)
        stop = page.get_by_role("button", name="Stop")
        expect(stop).to_be_enabled()
        expect(page.locator("#sharing")).to_have_text("1", timeout=5_000)   # this request shares the model
        stop.click()
        expect(answer).to_have_attribute("data-done", "1", timeout=10_000)
        expect(answer.locator(".meta")).to_contain_text("stopped")
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
        expect(page.locator("#sharing")).to_have_text("0", timeout=5_000)
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/health").json()["cancelled"] == before:
            assert time.monotonic() < deadline, "the server did not cancel the stopped generation"
            time.sleep(0.05)
        page.screenshot(path=str(shot_dir(tmp_path) / "chat-stopped.png"))
    finally:
        if is_fake(runtime):
            runtime.delay = 0.004



MARKDOWN_ANSWER = ("Here is the function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
                   "It **adds** `a` and `b`.\n\n<img src=x onerror=\"window.pwned=1\">\n")


def test_markdown_answer_renders_code_block_with_copy_button(page, tmp_path):
    from fake_runtime import FakeRuntime
    runtime = FakeRuntime(answer_text=MARKDOWN_ANSWER, delay=0.002)
    with BackgroundServer(create_app(runtime, default_spec="auto")) as s:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=s.url)
        page.goto(s.url + "/")
        expect(page.locator("#model")).to_have_text(runtime.name)
        text, _ = ask(page, "Write add().", max_tokens=400)   # the fake's tokens are bytes
        answer = page.locator(".msg.assistant").last
        code = answer.locator("pre code.language-python")
        expect(code).to_have_count(1)
        assert code.text_content() == "def add(a, b):\n    return a + b\n"
        assert "```" not in text, "the code fence was shown as raw text"
        expect(answer.locator("strong")).to_have_text("adds")
        expect(answer.locator(":not(pre) > code")).to_have_count(2)
        assert page.evaluate("window.pwned") is None, "the answer's HTML ran script: not sanitized"
        assert answer.locator("img").count() == 0, "an answer's image would make the page fetch from anywhere"
        copy = answer.get_by_role("button", name="Copy python block")
        copy.click()
        expect(copy).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == "def add(a, b):\n    return a + b\n"
        page.screenshot(path=str(shot_dir(tmp_path) / "chat-markdown.png"))

// speczoo chat page: talks to /v1/chat/completions with stream=true and shows the answer as it arrives,
// plus live tok/s and accepted-per-round from the per-chunk `speczoo` round stats. No build step.
// Answers are Markdown: rendered by the vendored marked, sanitized by DOMPurify (a model's output is
// untrusted), code blocks set apart with a copy button. The conversation keeps the raw text.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, specModes: [], messages: [], controller: null };

function specMode() {
  if (!$("spec").checked) return "off";
  for (const m of ["auto", "ngram", "draft"]) if (state.specModes.includes(m)) return m;
  return "off";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setReadout(r) {
  $("tps").value = r.tps === undefined ? "–" : r.tps.toFixed(1);
  $("apr").value = r.apr === undefined ? "–" : r.apr.toFixed(2);
  $("rounds").value = r.rounds === undefined ? "–" : String(r.rounds);
  $("tokens").value = r.tokens === undefined ? "–" : String(r.tokens);
  $("drafter").value = r.drafter || "–";
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.append(body);
  div.setAttribute("aria-label", role === "user" ? "You" : "Assistant");
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// Render `text` (Markdown) into `el`; code blocks get a copy button. Falls back to plain text when the
// vendored libraries did not load.
function renderMarkdown(el, text) {
  if (!window.marked || !window.DOMPurify) { el.textContent = text; return; }
  // No images: an answer must not make the page fetch from anywhere.
  el.innerHTML = DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), { FORBID_TAGS: ["img"] });
  for (const pre of el.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const lang = code && (code.className.match(/language-(\S+)/) || [])[1];
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const label = document.createElement("span");
    label.textContent = lang || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", "Copy " + (lang || "code") + " block");
    copy.addEventListener("click", () => copyText(code ? code.textContent : pre.textContent, copy));
    bar.append(label, copy);
    pre.before(bar);
  }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (e) {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    state.model = j.data[0].id;
    state.specModes = j.data[0].spec_modes || [];
    $("model").textContent = state.model;
  } catch (e) {
    $("model").textContent = "(cannot list models: " + e.message + ")";
  }
}

// How many requests share the model right now (the server batches them with --parallel): /health's
// `running`, polled while the page is visible.
async function pollSharing() {
  if (document.hidden) return;
  try {
    const r = await fetch("/health");
    if (r.ok) $("sharing").value = String((await r.json()).running);
  } catch (e) {
    $("sharing").value = "–";
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "1" : "0";
}

// Parse server-sent events from a fetch body; calls onData(string) for each `data:` payload.
async function readSSE(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) !== -1) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data && onData(data) === false) return;
    }
  }
}

async function send(text) {
  if (!state.model) await loadModel();
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  const out = div.querySelector(".text");
  div.setAttribute("aria-live", "polite");
  div.setAttribute("aria-busy", "true");
  const live = { tokens: 0, rounds: 0, accepted: 0, t0: 0, base: 0 };
  const spec = specMode();
  setReadout({ drafter: spec });
  state.controller = new AbortController();
  setBusy(true);
  $("status").textContent = "Generating…";
  let answer = "", usage = null, finish = null, error = null, pending = false, streaming = true;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: state.controller.signal,
      body: JSON.stringify({
        model: state.model, messages: state.messages, stream: true,
        stream_options: { include_usage: true }, temperature: 0,
        max_tokens: Number($("max-tokens").value) || 256, speculative: spec,
      }),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : r.status + " " + r.statusText);
    }
    await readSSE(r.body, (data) => {
      if (data === "[DONE]") return false;
      const c = JSON.parse(data);
      if (c.error) throw new Error(c.error.message);
      if (c.usage) usage = c.usage;
      const ch = c.choices && c.choices[0];
      if (ch && ch.delta && ch.delta.content) {
        answer += ch.delta.content;
        if (!pending) {
          pending = true;
          requestAnimationFrame(() => {
            pending = false;
            if (!streaming) return;          // the final render (or the error) below has the last word
            renderMarkdown(out, answer);
            div.scrollIntoView({ block: "end" });
          });
        }
      }
      if (ch && ch.finish_reason) finish = ch.finish_reason;
      if (c.speczoo && c.speczoo.tokens > 0) {
        if (!live.t0) { live.t0 = performance.now(); live.base = c.speczoo.tokens; }
        live.tokens += c.speczoo.tokens;
        live.rounds += 1;
        live.accepted += c.speczoo.accepted;
        const secs = (performance.now() - live.t0) / 1000;
        setReadout({ tps: secs > 0 ? (live.tokens - live.base) / secs : 0, apr: live.accepted / live.rounds,
                     rounds: live.rounds, tokens: live.tokens, drafter: spec });
      }
    });
  } catch (e) {
    error = e.name === "AbortError" ? null : e;
    if (e.name === "AbortError") finish = "stopped";
  } finally {
    streaming = false;
    state.controller = null;
    setBusy(false);
    div.setAttribute("aria-busy", "false");
    div.removeAttribute("aria-live");
  }
  if (usage) {
    setReadout({ tps: usage.tokens_per_second, apr: usage.accepted_per_round, rounds: usage.rounds,
                 tokens: usage.completion_tokens, drafter: usage.drafter });
  }
  if (error) {
    div.classList.add("error");
    out.textContent = answer + (answer ? "\n" : "") + "Error: " + error.message;   // raw: no half-rendered markup
    state.messages.pop();
    $("status").textContent = "Error: " + error.message;
    return;
  }
  renderMarkdown(out, answer);
  state.messages.push({ role: "assistant", content: answer });
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = (finish === "stopped" ? "stopped" : finish || "") +
    (usage ? ` · ${usage.completion_tokens} tokens · ${usage.tokens_per_second.toFixed(1)} tok/s · ` +
             `${usage.accepted_per_round.toFixed(2)} accepted/round · ${usage.drafter}` : "");
  div.append(meta);
  $("status").textContent = "Answer complete. " + meta.textContent;
  div.dataset.done = "1";
}

function submit() {
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  send(text);
}

document.addEventListener("DOMContentLoaded", () => {
  loadModel();
  pollSharing();
  setInterval(pollSharing, 1000);
  $("ask").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  $("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller) state.controller.abort();
  });
  $("spec").addEventListener("change", () => {
    $("spec-label").textContent = $("spec").checked ? "⚡Spec" : "Greedy";
  });
  $("new-chat").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.messages = [];
    $("log").replaceChildren();
    setReadout({});
    $("status").textContent = "New conversation.";
    $("prompt").focus();
  });
  $("prompt").focus();
});

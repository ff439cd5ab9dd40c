"""The inspector as one self-contained HTML page: a sample list to click through, each sample
token by token (the same colours as the terminal), its tool calls and the reference comparison.

No network: CSS and JavaScript are inline, the data is one JSON block in the page, and each
token's text is stored once per page (a vocabulary table), so a page of hundreds of samples
stays small.
"""

from __future__ import annotations

import html
import json
from typing import Any

from specregen.inspect.view import (
    PART_LABELS,
    PARTS,
    SampleView,
    conversation_line,
    prompt_runs,
    sample_summary,
    token_text,
)
from specregen.models.tokenizer import Tokenizer

_PART_INDEX = {p: i for i, p in enumerate(PARTS)}
PROMPT_TAIL = 64


def page_data(views: list[SampleView], tok: Tokenizer, *, title: str, source: str
              ) -> dict[str, Any]:
    vocab: dict[int, list[Any]] = {}
    samples = []
    for view in views:
        for t in view.tokens:
            if t.id not in vocab:
                vocab[t.id] = [t.text, t.special]
        ids = [t.id for t in view.tokens]
        diff = None
        if view.diff is not None:
            for tid in (*view.diff.ours, *view.diff.reference):
                if tid not in vocab:
                    vocab[tid] = [token_text(tok, tid), tok.added_name(tid)]
            diff = {"first": view.diff.first, "note": view.diff.note,
                    "ours": view.diff.ours, "reference": view.diff.reference}
        facts = sample_summary(view)
        samples.append({
            "facts": facts,
            "conversation": conversation_line(facts),
            # The prompt's last 64 tokens and its loss-mask-1 runs shown, the rest on a click.
            "prompt_runs": [list(r) for r in prompt_runs(view, PROMPT_TAIL)],
            "ids": ids,
            "mask": "".join(str(t.mask) for t in view.tokens),
            "part": "".join(str(_PART_INDEX[t.part]) for t in view.tokens),
            "call_spans": _call_spans(view),
            "literal": sorted(view.literal),
            "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                      for c in view.sample.tool_calls],
            "diff": diff,
            "reference_note": view.reference_note,
        })
    return {"title": title, "source": source, "parts": [PART_LABELS[p] for p in PARTS],
            "vocab": {str(k): v for k, v in vocab.items()}, "samples": samples}


def _call_spans(view: SampleView) -> list[list[int]]:
    """[start, end, call] runs of the tokens inside each tool call (smaller than a list with
    an entry per token)."""
    spans: list[list[int]] = []
    for t in view.tokens:
        if t.call is None:
            continue
        if spans and spans[-1][2] == t.call and spans[-1][1] == t.index:
            spans[-1][1] = t.index + 1
        else:
            spans.append([t.index, t.index + 1, t.call])
    return spans


def render_page(views: list[SampleView], tok: Tokenizer, *, title: str, source: str) -> str:
    data = page_data(views, tok, title=title, source=source)
    # `</` would end the script element early; JSON allows the escaped form.
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (_PAGE.replace("__TITLE__", html.escape(title))
            .replace("__CSS__", _CSS).replace("__JS__", _JS).replace("__DATA__", blob))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__CSS__</style></head>
<body>
<header><h1>__TITLE__</h1><div id="source"></div>
<input id="filter" type="search" placeholder="filter: id, flag or status"></header>
<div id="main"><nav id="list" aria-label="samples"></nav><main id="sample"></main></div>
<script id="data" type="application/json">__DATA__</script>
<script>__JS__</script>
</body></html>
"""

_CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1b1f24;
background:#f6f7f9}
header{display:flex;gap:16px;align-items:center;padding:8px 16px;background:#24292f;color:#fff}
header h1{font-size:16px;margin:0}#source{font-size:12px;opacity:.8;flex:1}
#filter{width:260px;padding:4px 8px;border-radius:4px;border:0}
#main{display:flex;height:calc(100vh - 46px)}
nav{width:300px;overflow:auto;border-right:1px solid #d0d7de;background:#fff}
nav a{display:block;padding:6px 10px;border-bottom:1px solid #eee;color:inherit;
text-decoration:none;font-size:12px;cursor:pointer}
nav a.on{background:#ddf4ff}nav a .id{font-family:ui-monospace,monospace;word-break:break-all}
nav a .st{float:right;font-weight:600}
.ok{color:#1a7f37}.flagged{color:#9a6700}.error{color:#cf222e}
main{flex:1;overflow:auto;padding:12px 20px}
table.facts{border-collapse:collapse;margin-bottom:8px}
table.facts td{padding:2px 10px 2px 0;vertical-align:top}
table.facts td:first-child{font-weight:600;white-space:nowrap}
.legend span{display:inline-block;padding:0 6px;margin-right:8px;border-radius:3px}
h3{margin:14px 0 4px;font-size:13px;color:#0969da;border-bottom:1px solid #d0d7de}
.toks{font:13px/1.7 ui-monospace,SFMono-Regular,Menlo,monospace;white-space:pre-wrap;
word-break:break-all;background:#fff;border:1px solid #d0d7de;padding:6px;border-radius:4px}
.t{border-radius:2px}
.m0.a{background:#e4e7eb}.m0.b{background:#cfd4da}
.m1.a{background:#cfe4ff}.m1.b{background:#a9ceff}
.sp{background:#ffd33d;color:#24292f;font-weight:700;padding:0 2px;margin:0 1px;
white-space:nowrap;word-break:normal}
.diff{background:#cf222e!important;color:#fff}
.lit{background:#fb8f44!important;color:#000;font-weight:700}
.nl{color:#8c959f}
.more{color:#57606a;font-style:italic;cursor:pointer;text-decoration:underline}
table.grid{border-collapse:collapse;font:12px ui-monospace,monospace}
table.grid td,table.grid th{border:1px solid #d0d7de;padding:2px 6px;text-align:left;
vertical-align:top;white-space:pre-wrap}
tr.bad td{background:#ffebe9}
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const list = document.getElementById("list"), pane = document.getElementById("sample");
document.getElementById("source").textContent = D.source + " \u00b7 " + D.samples.length +
  " samples";
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function shown(text) {
  return text.replace(/\t/g, "\u2192").replace(/\r/g, "\u240d");
}
function tokenSpan(s, i, n, diffAt) {
  const id = s.ids[i], v = D.vocab[id] || ["#" + id, null], mask = s.mask[i];
  const span = el("span", "t");
  span.title = "#" + i + "  id " + id + "  mask " + mask + "  " + D.parts[+s.part[i]] +
    (v[1] ? "  " + v[1] : "");
  if (v[1]) {
    span.className = "t sp";
    span.textContent = v[1];
  } else {
    span.className = "t m" + mask + (n % 2 ? " b" : " a");
    const parts = shown(v[0]).split("\n");
    parts.forEach((p, k) => {
      if (k > 0) { span.appendChild(el("span", "nl", "\u21b5")); span.appendChild(
        document.createTextNode("\n")); }
      if (p) span.appendChild(document.createTextNode(p));
    });
    if (!v[0]) span.textContent = "\u2205";
  }
  if (i === diffAt) span.classList.add("diff");
  return span;
}
function callOf(s) {
  const call = new Array(s.ids.length).fill(-1);
  s.call_spans.forEach(([a, b, c]) => { for (let i = a; i < b; i++) call[i] = c; });
  return call;
}
function groups(s) {
  const out = [], call = callOf(s);
  for (let i = 0; i < s.ids.length; i++) {
    const c = call[i];
    let key = c >= 0 ? "tool call " + c : D.parts[+s.part[i]];
    if (key === "tool-call markers") key = "tool section";
    if (out.length && out[out.length - 1].key === key) out[out.length - 1].end = i + 1;
    else out.push({key: key, start: i, end: i + 1});
  }
  return out;
}
function renderTokens(box, s, start, end, diffAt, limit) {
  let n = 0;
  if (!s.litSet) s.litSet = new Set(s.literal);
  const stop = limit ? Math.min(end, start + limit) : end;
  for (let i = start; i < stop; i++, n++) {
    const span = tokenSpan(s, i, n, diffAt);
    if (s.litSet.has(i)) span.classList.add("lit");
    box.appendChild(span);
  }
  if (stop < end) {
    const more = el("span", "more", " \u2026 " + (end - stop) + " more tokens (click) ");
    more.onclick = () => { more.remove(); renderTokens(box, s, stop, end, diffAt, 0); };
    box.appendChild(more);
  }
}
function facts(s) {
  const f = s.facts, t = el("table", "facts");
  const rows = [["status", f.status], ["flags", f.flags.join(", ") || "none"],
    ["evidence", f.evidence || "not recorded"],
    ["reference ids", f.reference_match || "none returned"],
    ["finish reason", String(f.finish_reason)], ["thinking", f.thinking ? "on" : "off"],
    ["tokens", "prompt " + f.prompt_len + ", completion " + f.completion_len +
      ", tool calls " + f.tool_calls],
    ["vs usage", f.usage_prompt_delta === null && f.usage_completion_delta === null ?
      "no usage" : "prompt " + f.usage_prompt_delta + ", completion " +
      f.usage_completion_delta]];
  if (s.conversation) rows.splice(1, 0, ["conversation", s.conversation],
    ["earlier answers", f.prompt_generated + " prompt tokens the model generated earlier " +
      "in this user turn (loss mask 1)"]);
  if (f.error) rows.push(["error", f.error]);
  (f.quarantine_reasons || []).forEach(r => rows.push(["quarantined", r]));
  rows.forEach(([k, v]) => {
    const tr = el("tr");
    tr.appendChild(el("td", "", k));
    tr.appendChild(el("td", k === "status" ? f.status : "", v));
    t.appendChild(tr);
  });
  return t;
}
function tokText(id) {
  const v = D.vocab[id];
  return v ? (v[1] || JSON.stringify(v[0])) : "#" + id;
}
function reference(s) {
  const box = el("div");
  box.appendChild(el("h3", "", "reference ids (the server's own completion ids)"));
  if (!s.diff) { box.appendChild(el("p", "", s.reference_note ||
    "the server returned no ids for this sample")); return box; }
  if (s.diff.note) box.appendChild(el("p", "", s.diff.note));
  if (s.diff.first === null) {
    box.appendChild(el("p", "ok", "equal: all " + s.diff.ours.length +
      " completion ids match the server's"));
    return box;
  }
  box.appendChild(el("p", "error", "first difference at completion token " + s.diff.first +
    " (input position " + (s.facts.prompt_len + s.diff.first) + ")"));
  const t = el("table", "grid"), head = el("tr");
  ["pos", "ours: id", "ours: text", "server: id", "server: text"].forEach(h =>
    head.appendChild(el("th", "", h)));
  t.appendChild(head);
  const lo = Math.max(0, s.diff.first - 3);
  const hi = Math.min(s.diff.first + 10, Math.max(s.diff.ours.length,
    s.diff.reference.length));
  for (let p = lo; p < hi; p++) {
    const a = s.diff.ours[p], b = s.diff.reference[p], tr = el("tr", a !== b ? "bad" : "");
    [p, a === undefined ? "" : a, a === undefined ? "(end)" : tokText(a),
     b === undefined ? "" : b, b === undefined ? "(end)" : tokText(b)].forEach(c =>
      tr.appendChild(el("td", "", String(c))));
    t.appendChild(tr);
  }
  box.appendChild(t);
  return box;
}
function calls(s) {
  const box = el("div");
  if (!s.calls.length) return box;
  box.appendChild(el("h3", "", "tool calls in the ids"));
  const t = el("table", "grid"), head = el("tr");
  ["#", "id", "name", "arguments"].forEach(h => head.appendChild(el("th", "", h)));
  t.appendChild(head);
  s.calls.forEach((c, k) => {
    const tr = el("tr");
    let args = c.arguments;
    try { args = JSON.stringify(JSON.parse(args), null, 1); } catch (e) { /* verbatim */ }
    [k, c.id, c.name, args].forEach(v => tr.appendChild(el("td", "", String(v))));
    t.appendChild(tr);
  });
  box.appendChild(t);
  return box;
}
function show(k) {
  const s = D.samples[k];
  list.querySelectorAll("a").forEach(a => a.classList.toggle("on", +a.dataset.k === k));
  pane.replaceChildren();
  pane.appendChild(el("h2", "", s.facts.sample_id));
  pane.appendChild(facts(s));
  const lg = el("div", "legend");
  [["m0 a t", "loss mask 0"], ["m1 a t", "loss mask 1"], ["t sp", "<|special|>"],
   ["t diff", "first difference"], ["t lit", "marker as text"]].forEach(([c, x]) =>
    lg.appendChild(el("span", c, x)));
  lg.appendChild(document.createTextNode(" alternating shades mark token boundaries; " +
    "hover a token for its id"));
  pane.appendChild(lg);
  const diffAt = s.diff && s.diff.first !== null ? s.facts.prompt_len + s.diff.first : -1;
  groups(s).forEach(g => {
    const masks = Array.from(new Set(s.mask.slice(g.start, g.end))).sort().join("/");
    pane.appendChild(el("h3", "", g.key + " \u00b7 " + (g.end - g.start) +
      " tokens \u00b7 loss mask " + masks));
    const box = el("div", "toks");
    if (g.key === "prompt") {
      s.prompt_runs.forEach(([a, b, shown]) => {
        const run = el("span");
        if (shown) renderTokens(run, s, a, b, diffAt, 0);
        else {
          const more = el("span", "more", "\u2026 " + (b - a) +
            " prompt tokens, loss mask 0 (click) ");
          more.onclick = () => { run.replaceChildren(); renderTokens(run, s, a, b, diffAt, 0); };
          run.appendChild(more);
        }
        box.appendChild(run);
      });
    } else {
      renderTokens(box, s, g.start, g.end, diffAt, 2000);
    }
    pane.appendChild(box);
  });
  pane.appendChild(calls(s));
  pane.appendChild(reference(s));
  if (location.hash !== "#" + k) history.replaceState(null, "", "#" + k);
}
D.samples.forEach((s, k) => {
  const a = el("a");
  a.dataset.k = k;
  a.appendChild(el("span", "st " + s.facts.status, s.facts.status));
  a.appendChild(el("div", "id", s.facts.sample_id));
  if (s.facts.flags.length) a.appendChild(el("div", "flagged", s.facts.flags.join(", ")));
  a.onclick = () => show(k);
  list.appendChild(a);
});
document.getElementById("filter").oninput = e => {
  const q = e.target.value.toLowerCase();
  list.querySelectorAll("a").forEach(a => {
    a.style.display = a.textContent.toLowerCase().includes(q) ? "" : "none";
  });
};
if (D.samples.length) {
  const k = parseInt(location.hash.slice(1), 10);
  show(k >= 0 && k < D.samples.length ? k : 0);
} else {
  pane.appendChild(el("p", "", "No sample matched."));
}
"""

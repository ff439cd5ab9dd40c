"""The dataset report as one HTML page: headline numbers, then a chart per question a person
asks before training on the data. Inline CSS and SVG only: no script, no external asset."""

from __future__ import annotations

from html import escape
from typing import Any

from specregen.gate.report import transformation_rows
from specregen.records import EVIDENCE_LEVELS
from specregen.report import svg
from specregen.report.build import ReportData
from specregen.report.stats import LENGTHS, histogram, summary

LENGTH_TITLES = {
    "prompt": "Prompt length",
    "reasoning": "Reasoning length",
    "content": "Content length",
    "tool_section": "Tool-call section length",
    "completion": "Completion length (all generated tokens)",
}
STATUS_COLORS = {"ok": "green", "flagged": "amber", "error": "red"}
EVIDENCE_COLORS = {"reference": "green", "logprobs": "green", "usage_exact": "blue",
                   "usage_tolerated": "amber", "none": "red"}


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "–"


def _money(value: float | None) -> str:
    return "not recorded" if value is None else f"${value:,.4f}"


def headline(data: ReportData) -> list[dict[str, str]]:
    """The numbers a person checks first, as rows (the Prefect table artifact too)."""
    return headline_rows(data.gate or {}, data.inference, data.stats.prompt_tokens,
                         data.stats.completion_tokens)


def headline_rows(
    gate: dict[str, Any], inference: dict[str, Any] | None,
    prompt_tokens: int | None = None, completion_tokens: int | None = None,
) -> list[dict[str, str]]:
    """Headline rows from the gate report and what inference spent; token counts are the
    reconstructed ones when given, else the provider's `usage`."""
    totals = gate.get("totals", {})
    inf = inference or {}
    samples = int(totals.get("samples", 0))
    accepted, quarantined = int(totals.get("accepted", 0)), int(totals.get("quarantined", 0))
    cost = inf.get("cost_usd")
    prompt = prompt_tokens if prompt_tokens is not None else inf.get("prompt_tokens")
    completion = completion_tokens if completion_tokens is not None else \
        inf.get("completion_tokens")
    rows = [
        ("verdict", str(gate.get("verdict", "?")).upper()),
        ("samples", f"{samples:,}"),
        ("accepted", f"{accepted:,} ({_share(accepted, samples)})"),
        ("quarantined", f"{quarantined:,} ({_share(quarantined, samples)})"),
        ("samples with tool calls", f"{totals.get('samples_with_calls', 0):,} "
                                    f"({totals.get('tool_calls', 0):,} calls)"),
        ("prompt tokens", f"{prompt:,}" if prompt is not None else "not recorded"),
        ("completion tokens", f"{completion:,}" if completion is not None else "not recorded"),
        ("cost", _money(cost)),
        ("cost per 1,000 samples", _money(cost / samples * 1000) if cost is not None
         and samples else "not recorded"),
    ]
    conv = gate.get("conversations")
    if conv:
        rows.insert(5, ("conversations regenerated to the end",
                        f"{conv.get('ended', 0):,} of {conv.get('conversations', 0):,} "
                        f"({_share(conv.get('ended', 0), conv.get('conversations', 0))})"))
    return [{"what": k, "value": v} for k, v in rows]


def render_report(data: ReportData) -> str:
    s = data.stats
    gate = data.gate or {}
    sections = [
        _tiles(data),
        _verdict(gate),
        _lengths(data),
        _counts_section("Reconstruction status", [(k, v) for k, v in s.statuses.most_common()],
                        s.samples, colors=STATUS_COLORS),
        _counts_section("Finish reasons", s.finish_reasons.most_common(), s.samples),
        _counts_section("Reconstruction flags (samples)", s.flags.most_common(30), s.samples,
                        color="amber"),
        _evidence(data),
        _transformations(data),
        _quarantine(data),
        _tools(data),
        _trigger(gate.get("trigger_agreement")),
        _conversations(gate.get("conversations")),
        _spend(data),
        _notes(data),
    ]
    title = f"specregen report: {data.dataset}"
    body = "\n".join(x for x in sections if x)
    # replace(), not format(): the CSS is full of braces.
    return (_PAGE.replace("__TITLE__", escape(title)).replace("__CSS__", _CSS)
            .replace("__BODY__", body))


def _tiles(data: ReportData) -> str:
    cells = "".join(f'<div class="tile"><div class="k">{escape(r["what"])}</div>'
                    f'<div class="v">{escape(r["value"])}</div></div>' for r in headline(data))
    return f'<section class="tiles">{cells}</section>'


def _verdict(gate: dict[str, Any]) -> str:
    if not gate:
        return ""
    verdict = str(gate.get("verdict", "?"))
    why = "".join(f"<li>{escape(str(w))}</li>" for w in gate.get("why", []))
    return (f'<section><h2>Gate verdict: <span class="{escape(verdict)}">{escape(verdict.upper())}'
            f'</span></h2><ul>{why}</ul></section>')


def _lengths(data: ReportData) -> str:
    blocks = []
    for name in LENGTHS:
        values = data.stats.length_array(name)
        if values.size == 0:
            continue
        st = summary(values)
        stats = (f'mean {st["mean"]:,.0f} · median {st["p50"]:,.0f} · p90 {st["p90"]:,.0f} · '
                 f'p99 {st["p99"]:,.0f} · max {st["max"]:,.0f} · zero {st["zero"]:,}')
        color = "green" if name in ("reasoning", "content") else "blue"
        blocks.append(f'<div class="card"><h3>{LENGTH_TITLES[name]}</h3>'
                      f'{svg.histogram(histogram(values), color=color)}'
                      f'<p class="st">{stats} (tokens)</p></div>')
    if not blocks:
        return ""
    return '<section><h2>Length distributions</h2><div class="cards">' + "".join(blocks) + \
        "</div></section>"


def _counts_section(title: str, rows: list[tuple[Any, int]], total: int, *, color: str = "blue",
                    colors: dict[str, str] | None = None, note: str = "") -> str:
    chart = svg.bars([(str(k), v) for k, v in rows], total=total, color=color, colors=colors)
    extra = f'<p class="st">{escape(note)}</p>' if note else ""
    return f"<section><h2>{escape(title)}</h2>{extra}{chart}</section>"


def _evidence(data: ReportData) -> str:
    s = data.stats
    if not s.has_evidence:
        return ('<section><h2>Evidence levels</h2><p class="none">The token shards carry no '
                '<code>evidence</code> column.</p></section>')
    order = EVIDENCE_LEVELS
    rows: list[tuple[str, int]] = [(k, s.evidence.get(k, 0)) for k in order
                                   if s.evidence.get(k)]
    rows += [(k, v) for k, v in s.evidence.items() if k not in order]
    accepted = [(k, s.evidence_accepted.get(k, 0)) for k, _ in rows]
    return (_counts_section("Evidence levels (all samples)", rows, s.samples,
                            colors=EVIDENCE_COLORS)
            + _counts_section("Evidence levels (accepted samples)", accepted, s.accepted,
                              colors=EVIDENCE_COLORS))


def _transformations(data: ReportData) -> str:
    """What the endpoint probe found the server does to the model's text (the gate report's
    `provider`), and the samples each touched."""
    rows = [f"<tr><td>{escape(label)}</td><td>{verdict}</td><td>{touched:,}</td>"
            f"<td>{escape(meaning)}</td></tr>" for label, verdict, touched, meaning
            in transformation_rows((data.gate or {}).get("provider"), data.stats.flags)]
    if not rows:
        return ""
    return ('<section><h2>Server text transformations</h2><table class="grid"><tr>'
            "<th>transformation</th><th>probe found</th><th>samples</th><th>what it means</th>"
            f"</tr>{''.join(rows)}</table></section>")


def _quarantine(data: ReportData) -> str:
    gate = data.gate or {}
    by_check = gate.get("by_check") or dict(data.stats.quarantine_checks)
    rows = sorted(((k, v) for k, v in by_check.items() if v), key=lambda kv: -kv[1])
    note = "A sample can fail several checks; each counts once per check."
    return _counts_section("Quarantine reasons by gate check", rows, data.stats.samples,
                           color="red", note=note)


def _tools(data: ReportData) -> str:
    s = data.stats
    per_sample = sorted(s.calls_per_sample.items())
    rows = [(f"{k} call{'s' if k != 1 else ''}", v) for k, v in per_sample]
    out = _counts_section("Tool calls per sample", rows, s.samples)
    gate = data.gate or {}
    by_tool = gate.get("by_tool")
    if by_tool:
        tool_rows = [(str(r["name"]), r["calls"]) for r in by_tool]
        table = "".join(
            f"<tr><td><code>{escape(str(r['name']))}</code></td><td>{r['calls']:,}</td>"
            f"<td>{r['quarantined']:,}</td><td>{_share(r['quarantined'], r['calls'])}</td></tr>"
            for r in by_tool)
        rest = gate.get("tools_not_listed") or {}
        if rest.get("calls"):
            table += (f"<tr><td>… {rest['tools']:,} more tools</td><td>{rest['calls']:,}</td>"
                      f"<td>{rest['quarantined']:,}</td>"
                      f"<td>{_share(rest['quarantined'], rest['calls'])}</td></tr>")
    else:
        tool_rows = s.tools.most_common(25)
        table = ""
    total_calls = sum(s.tools.values())
    out += _counts_section("Calls per tool", tool_rows, total_calls)
    if table:
        out += ('<section><table class="grid"><tr><th>tool</th><th>calls</th>'
                '<th>in quarantined samples</th><th>share</th></tr>' + table + "</table>"
                "</section>")
    return out


def _trigger(trigger: dict[str, Any] | None) -> str:
    if not trigger:
        return ('<section><h2>Tool-trigger agreement with the dataset</h2><p class="none">'
                "No reference answers from the dataset.</p></section>")
    called, text = trigger.get("dataset_called", 0), trigger.get("dataset_text", 0)
    rows = [
        ("dataset called → model called", trigger.get("model_called", 0), called),
        ("dataset called → same tool(s)", trigger.get("same_tool", 0), called),
        ("dataset called → same arguments", trigger.get("same_arguments", 0), called),
        ("dataset text → model text", trigger.get("model_text", 0), text),
        ("dataset text → model called", text - trigger.get("model_text", 0), text),
    ]
    body = "".join(
        f'<tr><td>{escape(name)}</td><td>{part:,} of {whole:,}</td>'
        f'<td><div class="meter"><div style="width:{(part / whole * 100) if whole else 0:.1f}%">'
        f'</div></div></td><td>{_share(part, whole)}</td></tr>' for name, part, whole in rows)
    return ('<section><h2>Tool-trigger agreement with the dataset</h2>'
            f'<table class="grid">{body}</table><p class="st">No reference answer: '
            f'{trigger.get("no_reference", 0):,} samples.</p></section>')


STOP_COLORS = {"end": "green", "unfinished": "grey"}


def _conversations(conv: dict[str, Any] | None) -> str:
    """Whole conversations: how their regeneration ended, and user turns reached."""
    if not conv:
        return ""
    n = int(conv.get("conversations", 0))
    reasons = [(str(r), int(k)) for r, k in (conv.get("by_stop_reason") or {}).items()]
    turns = [(f"{t} user turn{'s' if str(t) != '1' else ''}", int(k))
             for t, k in (conv.get("user_turns") or {}).items()]
    note = (f"{conv.get('ended', 0):,} of {n:,} regenerated to the end, "
            f"{conv.get('stopped', 0):,} stopped early"
            + (f", {conv['unfinished']:,} unfinished" if conv.get("unfinished") else "")
            + f"; {conv.get('samples', 0):,} samples (one per user turn reached), "
            f"{conv.get('accepted', 0):,} accepted; {conv.get('wholly_accepted', 0):,} "
            "conversations with every sample accepted.")
    colors = {r: STOP_COLORS.get(r, "amber") for r, _ in reasons}
    return (_counts_section("Conversations by how they ended", reasons, n, colors=colors,
                            note=note)
            + _counts_section("User turns reached per conversation", turns, n))


def _spend(data: ReportData) -> str:
    inf = data.inference
    s = data.stats
    rows = [("prompt tokens (reconstructed)", f"{s.prompt_tokens:,}"),
            ("completion tokens (reconstructed)", f"{s.completion_tokens:,}")]
    if inf:
        cost = inf.get("cost_usd")
        completion = inf.get("completion_tokens") or 0
        rows += [
            ("cost", _money(cost)),
            ("cost per sample", _money(cost / s.samples) if cost is not None and s.samples
             else "–"),
            ("cost per 1M completion tokens", _money(cost / completion * 1e6)
             if cost is not None and completion else "–"),
            ("requests sent", f"{inf.get('requests_sent', 0):,}"),
            ("retries", f"{inf.get('retries', 0):,}"),
            ("prompt tokens (usage)", f"{inf.get('prompt_tokens', 0):,}"),
            ("completion tokens (usage)", f"{completion:,}"),
            ("reasoning tokens (usage)", f"{inf.get('reasoning_tokens', 0):,}"),
        ]
        for name, count in sorted((inf.get("errors") or {}).items()):
            rows.append((f"attempt errors: {name}", f"{count:,}"))
    else:
        rows.append(("cost", "not recorded"))
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<section><h2>Cost and tokens</h2><table class="grid">{body}</table></section>'


def _notes(data: ReportData) -> str:
    items = [*data.notes, *(f"read {src}" for src in data.sources[:20])]
    if len(data.sources) > 20:
        items.append(f"… and {len(data.sources) - 20} more shards")
    lis = "".join(f"<li>{escape(x)}</li>" for x in items)
    return f'<section class="notes"><h2>Sources</h2><ul>{lis}</ul></section>'


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title><style>__CSS__</style></head>
<body><header><h1>__TITLE__</h1></header><main>
__BODY__
</main></body></html>
"""

_CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1b1f24;
background:#f6f7f9}
header{padding:10px 20px;background:#24292f;color:#fff}header h1{margin:0;font-size:18px}
main{padding:12px 20px;max-width:1240px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;
margin:0 0 12px}
h2{font-size:15px;margin:0 0 8px}h3{font-size:13px;margin:0 0 4px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:8px;
background:none;border:0;padding:0}
.tile{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
.tile .k{font-size:12px;color:#57606a}.tile .v{font-size:18px;font-weight:600}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(580px,1fr));gap:10px}
.card{border:1px solid #eaeef2;border-radius:4px;padding:6px}
.st{color:#57606a;font-size:12px;margin:4px 0}.none{color:#57606a;font-style:italic}
.pass{color:#1a7f37}.fail{color:#cf222e}
table.grid{border-collapse:collapse;font-size:13px}
table.grid td,table.grid th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
.meter{width:220px;height:12px;background:#eaeef2;border-radius:6px;overflow:hidden}
.meter div{height:100%;background:#4c8df6}
svg.chart{display:block;max-width:100%;height:auto}
.notes li{font-size:12px;color:#57606a;word-break:break-all}
"""

"""A sample in the terminal (rich): token boundaries as alternating backgrounds, the loss mask as
the colour family (grey: 0, blue: 1), special and marker tokens by name, one rule per part."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from specregen.inspect.view import (
    PART_LABELS,
    SampleView,
    TokenView,
    arguments_pretty,
    conversation_line,
    prompt_runs,
    sample_summary,
    token_text,
)
from specregen.models.tokenizer import Tokenizer

# Two shades per mask value: neighbours differ, so every token boundary shows.
# Explicit foregrounds: readable on dark and light terminals alike.
MASK_STYLES = {0: ("grey93 on grey23", "grey93 on grey42"),
               1: ("grey93 on navy_blue", "grey93 on dodger_blue3")}
SPECIAL_STYLE = "bold black on yellow1"
DIFF_STYLE = "bold white on red3"
LITERAL_STYLE = "bold black on orange1"  # marker text written as plain text
STATUS_STYLES = {"ok": "bold green", "flagged": "bold yellow", "error": "bold red"}


def visible(text: str) -> str:
    """Whitespace that would vanish made visible; a newline still breaks the line after ↵."""
    return text.replace("\t", "→").replace("\r", "␍").replace("\n", "↵\n")


def token_spans(tokens: list[TokenView], *, mark: set[int] | None = None,
                literal: set[int] | None = None,
                breaks: frozenset[str] = frozenset()) -> Text:
    """The tokens as styled text; a line ends after each special token named in `breaks`."""
    out = Text()
    for n, t in enumerate(tokens):
        if t.special is not None:
            out.append(t.special, style=SPECIAL_STYLE)
            if t.special in breaks:
                out.append("\n")
            continue
        style = MASK_STYLES.get(t.mask, MASK_STYLES[0])[n % 2]
        if literal and t.index in literal:
            style = LITERAL_STYLE
        if mark and t.index in mark:
            style = DIFF_STYLE
        out.append(visible(t.text) or "∅", style=style)
    return out


def _groups(tokens: list[TokenView]) -> list[tuple[str, list[TokenView]]]:
    """Consecutive tokens of one part (a tool call's markers, id and arguments are one group)."""
    groups: list[tuple[str, list[TokenView]]] = []
    for t in tokens:
        key = f"tool call {t.call}" if t.call is not None else t.part
        if key == "tool_markers":
            key = "tool section"
        if groups and groups[-1][0] == key:
            groups[-1][1].append(t)
        else:
            groups.append((key, [t]))
    return groups


def _elide(tokens: list[TokenView], limit: int) -> tuple[list[TokenView], list[TokenView], int]:
    if limit <= 0 or len(tokens) <= limit:
        return tokens, [], 0
    head = limit // 2
    return tokens[:head], tokens[len(tokens) - (limit - head) :], len(tokens) - limit


def header(view: SampleView) -> Panel:
    facts = sample_summary(view)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    status = facts["status"]
    grid.add_row("status", Text(status, style=STATUS_STYLES.get(status, "")))
    conversation = conversation_line(facts)
    if conversation is not None:
        grid.add_row("conversation", conversation)
        grid.add_row("earlier answers", f"{facts['prompt_generated']:,} prompt tokens the model "
                     "generated earlier in this user turn (loss mask 1)")
    grid.add_row("flags", Text(", ".join(facts["flags"]) or "none",
                               style="yellow" if facts["flags"] else "dim"))
    grid.add_row("evidence", str(facts["evidence"] or "not recorded"))
    grid.add_row("reference ids", str(facts["reference_match"] or "none returned"))
    grid.add_row("finish reason", str(facts["finish_reason"]))
    grid.add_row("thinking", "on" if facts["thinking"] else "off")
    grid.add_row("tokens", f"prompt {facts['prompt_len']:,}, completion "
                           f"{facts['completion_len']:,}, tool calls {facts['tool_calls']}")
    deltas = (facts["usage_prompt_delta"], facts["usage_completion_delta"])
    grid.add_row("vs usage", "no usage" if deltas == (None, None) else
                 f"prompt {deltas[0]:+d}, completion {deltas[1]:+d}"
                 if None not in deltas else f"prompt {deltas[0]}, completion {deltas[1]}")
    if "error" in facts:
        grid.add_row("error", Text(facts["error"], style="red"))
    for reason in facts.get("quarantine_reasons", []):
        grid.add_row("quarantined", Text(reason, style="red"))
    return Panel(grid, title=f"sample {view.sample.sample_id}", title_align="left",
                 border_style=STATUS_STYLES.get(status, ""))


def legend() -> Text:
    text = Text("legend: ")
    text.append(" loss mask ", style=MASK_STYLES[0][0])
    text.append(" 0 ", style=MASK_STYLES[0][1])
    text.append("  ")
    text.append(" loss mask ", style=MASK_STYLES[1][0])
    text.append(" 1 ", style=MASK_STYLES[1][1])
    text.append("  ")
    text.append("<|special|>", style=SPECIAL_STYLE)
    text.append("  ")
    text.append(" first difference ", style=DIFF_STYLE)
    text.append("  ")
    text.append(" marker as text ", style=LITERAL_STYLE)
    text.append("   ↵ newline  → tab  (alternating shades: token boundaries)")
    return text


def render_sample(
    view: SampleView, tok: Tokenizer, *, prompt_tokens: int = 48, part_tokens: int = 600
) -> Group:
    """The whole sample: header, tokens part by part, tool calls, the reference comparison.

    `prompt_tokens` / `part_tokens`: how many tokens of the prompt / of each other part to show
    (0: all); the rest is elided in the middle (the prompt: from its start) and counted.
    """
    mark: set[int] = set()
    if view.diff is not None and view.diff.first is not None:
        mark.add(view.sample.prompt_len + view.diff.first)
    items: list[Any] = [header(view), legend()]
    for key, tokens in _groups(view.tokens):
        masks = sorted({t.mask for t in tokens})
        label = PART_LABELS.get(key, key)
        items.append(Rule(f"{label} · {len(tokens):,} tokens · loss mask "
                          f"{'/'.join(map(str, masks))}", align="left", style="cyan"))
        if key == "prompt":
            # The last tokens and every loss-mask-1 run (earlier answers of the turn) shown;
            # the mask-0 stretches between them elided.
            for start, end, shown in prompt_runs(view, prompt_tokens):
                if shown:
                    items.append(token_spans(tokens[start:end], mark=mark,
                                             breaks=view.line_breaks))
                else:
                    items.append(Text(f"… {end - start:,} prompt tokens, loss mask 0 "
                                      "(--full shows them)", style="dim italic"))
            continue
        head, tail, hidden = _elide(tokens, part_tokens)
        items.append(token_spans(head, mark=mark, literal=view.literal,
                                 breaks=view.line_breaks))
        if hidden:
            items.append(Text(f"… {hidden:,} tokens …", style="dim italic"))
            items.append(token_spans(tail, mark=mark, literal=view.literal,
                                     breaks=view.line_breaks))
    items.extend(_tool_calls(view))
    items.extend(_reference(view, tok))
    return Group(*items)


def _tool_calls(view: SampleView) -> list[Any]:
    calls = view.sample.tool_calls
    if not calls:
        return []
    table = Table(title="tool calls in the ids", title_justify="left", show_lines=True)
    for column in ("#", "id", "name", "arguments"):
        table.add_column(column, overflow="fold")
    for n, call in enumerate(calls):
        table.add_row(str(n), call.id, call.name, arguments_pretty(call.arguments))
    return [table]


def _reference(view: SampleView, tok: Tokenizer, context: int = 3, after: int = 10) -> list[Any]:
    diff = view.diff
    if diff is None:
        return [Rule("reference ids", align="left", style="cyan"),
                Text(view.reference_note or "the server returned no ids for this sample",
                     style="dim")]
    items: list[Any] = [Rule("reference ids (the server's own completion ids)", align="left",
                             style="cyan")]
    if diff.note:
        items.append(Text(diff.note, style="dim"))
    if diff.first is None:
        items.append(Text(f"equal: all {len(diff.ours):,} completion ids match the server's",
                          style="green"))
        return items
    items.append(Text(f"first difference at completion token {diff.first:,} (input position "
                      f"{view.sample.prompt_len + diff.first:,}); ours {len(diff.ours):,} ids, "
                      f"the server's {len(diff.reference):,}", style="bold red"))
    table = Table(show_header=True, header_style="bold")
    table.add_column("pos", justify="right")
    table.add_column("ours: id", justify="right")
    table.add_column("ours: text")
    table.add_column("server: id", justify="right")
    table.add_column("server: text")
    lo = max(0, diff.first - context)
    hi = max(diff.first + after, lo)
    for pos in range(lo, min(hi, max(len(diff.ours), len(diff.reference)))):
        cells = []
        for ids in (diff.ours, diff.reference):
            if pos < len(ids):
                name = tok.added_name(ids[pos])
                cells += [str(ids[pos]), name or repr(token_text(tok, ids[pos]))]
            else:
                cells += ["", "(end)"]
        style = "bold red" if pos >= diff.first and cells[0] != cells[2] else ""
        table.add_row(str(pos), *cells, style=style)
    items.append(table)
    ours_text = tok.decode(diff.ours[diff.first : diff.first + 40])
    ref_text = tok.decode(diff.reference[diff.first : diff.first + 40])
    side = Table.grid(padding=(0, 2))
    side.add_column(style="bold")
    side.add_column()
    side.add_row("ours from there", repr(ours_text))
    side.add_row("server from there", repr(ref_text))
    items.append(side)
    return items

"""One sample as a person reads it: every token with its text, its name when it is a special or
marker token, its loss-mask value and the part of the answer it belongs to; and, when the server's
own ids are known, where ours first differ from them.

Parts follow the completion layout `reasoning [reasoning end] content [tool calls] end` of the
sample's chat format (`ChatFormat.markers` names its structural tokens by role): the marker tokens
themselves are looked up by name in the tokenizer, never by number, and no family is named here.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from specregen.models.chat_format import CompletionMarkers
from specregen.models.tokenizer import Tokenizer
from specregen.records import TokenSample

# The parts a token can belong to, in the order they appear. A format whose calls have no
# separate id (`CompletionMarkers.arguments_begin` None) puts a call's whole body in
# `tool_arguments`.
PARTS = ("prompt", "reasoning", "content", "tool_markers", "tool_id", "tool_arguments", "end")
PART_LABELS = {
    "prompt": "prompt",
    "reasoning": "reasoning",
    "content": "content",
    "tool_markers": "tool-call markers",
    "tool_id": "tool-call id",
    "tool_arguments": "tool-call arguments",
    "end": "end of turn",
}


@dataclass(frozen=True, slots=True)
class TokenView:
    index: int  # position in input_ids
    id: int
    text: str  # the token's bytes as text; bytes that are not whole UTF-8 shown as \xNN
    special: str | None  # the added token's name
    mask: int
    part: str  # one of PARTS
    call: int | None = None  # which tool call (0-based) inside the tool section


@dataclass(frozen=True, slots=True)
class ReferenceDiff:
    """Our completion ids against the server's own ids."""

    ours: list[int]
    reference: list[int]
    first: int | None  # first completion position where they differ; None when equal
    note: str = ""

    @property
    def equal(self) -> bool:
        return self.first is None


@dataclass
class SampleView:
    sample: TokenSample
    tokens: list[TokenView]
    evidence: str | None = None
    reasons: list[str] = field(default_factory=list)  # gate quarantine reasons, when stored
    diff: ReferenceDiff | None = None
    reference_note: str = ""  # why there is no diff, when there is none
    # Positions of completion text tokens that spell a marker or think tag as plain text.
    literal: set[int] = field(default_factory=set)
    # Special tokens a viewer ends the line after (the stop token, a closed call section).
    line_breaks: frozenset[str] = frozenset()

    @property
    def completion(self) -> list[TokenView]:
        return self.tokens[self.sample.prompt_len :]


def token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode_bytes([token_id]).decode("utf-8", errors="backslashreplace")


def build_view(
    sample: TokenSample,
    tok: Tokenizer,
    *,
    markers: CompletionMarkers,
    evidence: str | None = None,
    reasons: list[str] | None = None,
    reference_ids: list[int] | None = None,
    reference_note: str = "",
) -> SampleView:
    """The tokens of one sample with names, mask values and parts (laid out by the sample's
    format's `markers`); the reference diff."""
    m = markers
    by_id = {tok.added_tokens[name]: name for name in m.names() if name in tok.added_tokens}
    # A format without a section: its first call's opener starts the calls, and a call's
    # body runs to its closer (no id part).
    sectionless = m.calls_end is None
    body_part = "tool_id" if m.arguments_begin is not None else "tool_arguments"
    views: list[TokenView] = []
    cache: dict[int, str] = {}
    part = "reasoning" if sample.thinking else "content"
    call: int | None = None
    in_call = False
    for index, token_id in enumerate(sample.input_ids):
        text = cache.get(token_id)
        if text is None:
            text = cache[token_id] = token_text(tok, token_id)
        name = tok.added_name(token_id)
        mask = sample.loss_mask[index] if index < len(sample.loss_mask) else 0
        if index < sample.prompt_len:
            views.append(TokenView(index, token_id, text, name, mask, "prompt"))
            continue
        marker = by_id.get(token_id)
        in_section = part in ("tool_markers", "tool_id", "tool_arguments")
        this_part = part  # the reasoning end is shown as the reasoning's last token
        if marker == m.reasoning_end and part == "reasoning":
            part = "content"
        elif marker == m.calls_begin and not (sectionless and in_section):
            this_part = part = "tool_markers"
            if sectionless:  # the opener is also the first call's own
                call, in_call, part = 0, True, body_part
        elif marker == m.call_begin and in_section:
            call = 0 if call is None else call + 1
            in_call = True
            this_part, part = "tool_markers", body_part
        elif marker is not None and marker == m.arguments_begin and in_call:
            this_part, part = "tool_markers", "tool_arguments"
        elif marker is not None and marker in (m.call_end, m.calls_end) and in_section:
            this_part = part = "tool_markers"
        elif marker == m.end:
            this_part = part = "end"
        views.append(TokenView(index, token_id, text, name, mask, this_part,
                               call if in_call else None))
        if marker == m.call_end:
            in_call = False
    diff = None
    if reference_ids is not None and sample.status != "error":
        diff = compare_reference(sample.input_ids[sample.prompt_len :], reference_ids,
                                 tok.added_tokens.get(m.end), end_name=m.end)
    if evidence is None:
        evidence = getattr(sample, "evidence", None)  # a column of newer files
    return SampleView(sample=sample, tokens=views, evidence=evidence, reasons=list(reasons or []),
                      diff=diff, reference_note=reference_note,
                      literal=literal_tokens(views[sample.prompt_len :], m.literals),
                      line_breaks=frozenset(n for n in (m.end, m.calls_end) if n))


def literal_tokens(tokens: list[TokenView], literals: tuple[str, ...]) -> set[int]:
    """Text tokens that together spell a marker or think tag (never across a special token)."""
    text: list[str] = []
    starts: list[int] = []  # offset in the joined text of each text token
    owners: list[int] = []
    offset = 0
    for t in tokens:
        piece = "\0" if t.special is not None else t.text
        if t.special is None:
            starts.append(offset)
            owners.append(t.index)
        text.append(piece)
        offset += len(piece)
    joined = "".join(text)
    marked: set[int] = set()
    for literal in literals:
        at = joined.find(literal)
        while at >= 0:
            first = bisect_right(starts, at) - 1
            last = bisect_right(starts, at + len(literal) - 1) - 1
            marked.update(owners[first : last + 1])
            at = joined.find(literal, at + 1)
    return marked


def compare_reference(ours: list[int], reference: list[int], im_end: int | None,
                      end_name: str = "stop token") -> ReferenceDiff:
    """Where our completion ids first differ from the server's; a missing final stop token
    (`im_end`, named `end_name`) on either side is how servers differ in what they return,
    not a difference."""
    note = ""
    a, b = list(ours), list(reference)
    if im_end is not None and a[-1:] == [im_end] and b[-1:] != [im_end]:
        a = a[:-1]
        note = f"the server's ids omit the final {end_name}"
    elif im_end is not None and b[-1:] == [im_end] and a[-1:] != [im_end]:
        b = b[:-1]
        note = f"our ids end without {end_name} (truncated); the server's include it"
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return ReferenceDiff(ours=list(ours), reference=list(reference), first=first, note=note)


def sample_summary(view: SampleView) -> dict[str, Any]:
    """The header facts of a sample, as plain data (both views show the same ones)."""
    s = view.sample
    facts: dict[str, Any] = {
        "sample_id": s.sample_id,
        "status": s.status,
        "flags": list(s.flags),
        "evidence": view.evidence,
        "reference_match": s.reference_match,
        "finish_reason": s.finish_reason,
        "thinking": s.thinking,
        "prompt_len": s.prompt_len,
        "completion_len": s.completion_len,
        "usage_prompt_delta": s.usage_prompt_delta,
        "usage_completion_delta": s.usage_completion_delta,
        "tool_calls": len(s.tool_calls),
    }
    if s.conversation_id is not None:
        # One user turn of a whole conversation: the earlier answers of its tool loop sit in
        # the prompt with loss mask 1 (the model generated them).
        facts["conversation_id"] = s.conversation_id
        facts["user_turn"] = s.user_turn
        facts["stop_reason"] = s.stop_reason
        facts["prompt_generated"] = sum(s.loss_mask[: s.prompt_len])
    if s.error:
        facts["error"] = s.error
    if view.reasons:
        facts["quarantine_reasons"] = list(view.reasons)
    return facts


def conversation_line(facts: dict[str, Any]) -> str | None:
    """The header line of a conversation's sample (None for a single-turn sample)."""
    if "conversation_id" not in facts:
        return None
    return (f"{facts['conversation_id']} · user turn {facts['user_turn']} · the conversation "
            f"stopped: {facts['stop_reason'] or 'not yet (a request without a final answer)'}")


def prompt_runs(view: SampleView, tail: int, context: int = 8,
                min_gap: int = 16) -> list[tuple[int, int, bool]]:
    """The prompt cut into (start, end, shown) runs covering positions 0..prompt_len: its last
    `tail` tokens (0: all) and every loss-mask-1 run (a conversation's earlier answers of the
    turn, with `context` tokens before each, their role header) are shown; only the mask-0
    stretches between them of at least `min_gap` tokens are elided (a shorter one, e.g. a
    tool result between two answers, costs less to show than to announce)."""
    n = view.sample.prompt_len
    if tail <= 0 or n <= tail:
        return [(0, n, True)] if n else []
    keep = [False] * n
    for i in range(n - tail, n):
        keep[i] = True
    for t in view.tokens[:n]:
        if t.mask:
            for i in range(max(0, t.index - context), t.index + 1):
                keep[i] = True
    start = 0
    for i in range(1, n + 1):
        if i == n or keep[i] != keep[start]:
            if not keep[start] and i - start < min_gap:
                keep[start:i] = [True] * (i - start)
            start = i
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, n + 1):
        if i == n or keep[i] != keep[start]:
            runs.append((start, i, keep[start]))
            start = i
    return runs


def arguments_pretty(arguments: str) -> str:
    """Arguments as written when they are not JSON; indented when they are."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False, indent=1)
    except (ValueError, TypeError):
        return arguments

"""One sample as a person reads it: every token with its text, its name when it is a special or
marker token, its loss-mask value and the part of the answer it belongs to; and, when the server's
own ids are known, where ours first differ from them.

Parts follow the completion layout `R </think> C [section] <|im_end|>` (README, Reconstruction):
the marker tokens themselves are looked up by name in the tokenizer, never by number.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
    TOOL_MARKERS,
)
from specregen.models.tokenizer import Tokenizer
from specregen.records import TokenSample

# The parts a token can belong to, in the order they appear.
PARTS = ("prompt", "reasoning", "content", "tool_markers", "tool_id", "tool_arguments", "end")
# Marker and think-tag strings that, written as text by the model, raise `markers_in_text` /
# `think_tag_in_text`: the inspector points at them.
LITERALS = (*TOOL_MARKERS, THINK, THINK_END)
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
    special: str | None  # the added token's name, e.g. "<|im_end|>"
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

    @property
    def completion(self) -> list[TokenView]:
        return self.tokens[self.sample.prompt_len :]


def token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode_bytes([token_id]).decode("utf-8", errors="backslashreplace")


def build_view(
    sample: TokenSample,
    tok: Tokenizer,
    *,
    evidence: str | None = None,
    reasons: list[str] | None = None,
    reference_ids: list[int] | None = None,
    reference_note: str = "",
) -> SampleView:
    """The tokens of one sample with names, mask values and parts; the reference diff."""
    special_ids = {name: tok.added_tokens.get(name) for name in
                   (THINK_END, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END,
                    IM_END)}
    by_id = {v: k for k, v in special_ids.items() if v is not None}
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
        this_part = part  # `</think>` closes the reasoning and is shown as its last token
        if marker == THINK_END and part == "reasoning":
            part = "content"
        elif marker == SECTION_BEGIN:
            this_part = part = "tool_markers"
        elif marker == CALL_BEGIN and in_section:
            call = 0 if call is None else call + 1
            in_call = True
            this_part, part = "tool_markers", "tool_id"
        elif marker == ARG_BEGIN and in_call:
            this_part, part = "tool_markers", "tool_arguments"
        elif marker in (CALL_END, SECTION_END) and in_section:
            this_part = part = "tool_markers"
        elif marker == IM_END:
            this_part = part = "end"
        views.append(TokenView(index, token_id, text, name, mask, this_part,
                               call if in_call else None))
        if marker == CALL_END:
            in_call = False
    diff = None
    if reference_ids is not None and sample.status != "error":
        diff = compare_reference(sample.input_ids[sample.prompt_len :], reference_ids,
                                 special_ids.get(IM_END))
    if evidence is None:
        evidence = getattr(sample, "evidence", None)  # a column of newer files
    return SampleView(sample=sample, tokens=views, evidence=evidence, reasons=list(reasons or []),
                      diff=diff, reference_note=reference_note,
                      literal=literal_tokens(views[sample.prompt_len :]))


def literal_tokens(tokens: list[TokenView]) -> set[int]:
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
    for literal in LITERALS:
        at = joined.find(literal)
        while at >= 0:
            first = bisect_right(starts, at) - 1
            last = bisect_right(starts, at + len(literal) - 1) - 1
            marked.update(owners[first : last + 1])
            at = joined.find(literal, at + 1)
    return marked


def compare_reference(ours: list[int], reference: list[int], im_end: int | None) -> ReferenceDiff:
    """Where our completion ids first differ from the server's; a missing final `<|im_end|>`
    on either side is how servers differ in what they return, not a difference."""
    note = ""
    a, b = list(ours), list(reference)
    if im_end is not None and a[-1:] == [im_end] and b[-1:] != [im_end]:
        a = a[:-1]
        note = "the server's ids omit the final <|im_end|>"
    elif im_end is not None and b[-1:] == [im_end] and a[-1:] != [im_end]:
        b = b[:-1]
        note = "our ids end without <|im_end|> (truncated); the server's include it"
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return ReferenceDiff(ours=list(ours), reference=list(reference), first=first, note=note)


def tool_calls_of(sample: TokenSample) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in sample.tool_calls]


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
    if s.error:
        facts["error"] = s.error
    if view.reasons:
        facts["quarantine_reasons"] = list(view.reasons)
    return facts


def arguments_pretty(arguments: str) -> str:
    """Arguments as written when they are not JSON; indented when they are."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False, indent=1)
    except (ValueError, TypeError):
        return arguments

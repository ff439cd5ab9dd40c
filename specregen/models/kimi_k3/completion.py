"""A K3 completion as segments and as raw text, shared by format.py and readings.py (which
import it; it imports neither, so the format imports its readings and not the reverse): the
`Assembled` record, the completion's layout in the encoder's segmentation (format.py's
docstring draws it), the marker strings read as markers, and the one raw tool-call parser.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specregen.models.chat_format import ParsedCalls
from specregen.models.kimi_k3.encoding import (
    MARKERS,
    Segment,
    close_tag,
    open_tag,
    text,
    tools_segments,
)
from specregen.models.kimi_k3.servers import CALL_RE, TOOLS_CLOSE_RE, TOOLS_OPEN_RE, decode_call
from specregen.records import ToolCall


@dataclass
class Assembled:
    """A completion rebuilt as ids, with what it was built from and what was noticed (the
    other formats' shape)."""

    ids: list[int]
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    api_tool_calls: list[ToolCall]
    flags: list[str] = field(default_factory=list)


def arguments_object(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as the object vLLM's parser dumped (key order kept); None when they
    are not a JSON object."""
    try:
        value = json.loads(arguments) if arguments else {}
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def completion_segments(reasoning: str | None, content: str | None,
                        calls: Sequence[tuple[str, dict[str, Any]]], *, thinking: bool,
                        think_channel: bool = True) -> list[Segment]:
    """The model's completion (without the stop token) in the encoder's segmentation: the
    history layout of an assistant turn minus what the generation prompt already holds.
    `think_channel=False`: the model never closed its think channel (it opened the response
    straight away)."""
    out: list[Segment] = []
    if thinking:
        out += text(reasoning or "")
        if think_channel:
            out += close_tag("think")
        out += open_tag("response")
    out += text(content or "") + close_tag("response")
    if calls:
        out += tools_segments(calls)
    return out + close_tag("message")


def raw_segments(value: str) -> list[Segment]:
    """Model text whose marker strings were the marker ids (what a string parser saw as
    markers): split at the four marker strings."""
    out: list[Segment] = []
    rest = value
    while rest:
        at, found = min(((rest.find(m), m) for m in MARKERS if m in rest), default=(-1, ""))
        if at == -1:
            out += text(rest)
            break
        out += [*text(rest[:at]), (found, True)]
        rest = rest[at + len(found):]
    return out


def has_marker_text(value: str | None) -> bool:
    if not value:
        return False
    return "<|" in value and any(m in value for m in MARKERS)


def parse_calls(text_value: str, *, truncated: bool) -> ParsedCalls | None:
    """The format's one raw tool-call parser: the complete call blocks of the first tools
    channel (to its close, or the end), read as vLLM's parser reads them (name unescaped,
    typed arguments, `json.dumps`); ids are "" (the model writes none)."""
    m_open = TOOLS_OPEN_RE.search(text_value)
    if m_open is None:
        return None
    m_close = TOOLS_CLOSE_RE.search(text_value, m_open.end())
    section = text_value[m_open.end():m_close.start() if m_close else len(text_value)]
    calls = [ToolCall("", *decoded) for m in CALL_RE.finditer(section)
             if (decoded := decode_call(m["attrs"], m["body"])) is not None]
    return ParsedCalls(m_open.start(), calls)

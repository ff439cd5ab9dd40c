"""What the K2.5 modules share: the marker strings, the call-id rule, an assembled completion,
`tojson` and the count of the conversation's calls. format.py, readings.py and checks.py import
them from here (and this module none of them), so the format imports its readings and checks and
not the reverse. Facts come from ../shared/kimi/SPEC.md (sections 1-2 and 7).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specregen.records import ToolCall

IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
THINK = "<think>"
THINK_END = "</think>"

TOOL_MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)

# The id K2.5's template writes: `functions.NAME:IDX` (the one id regex of this format).
CANONICAL_ID = re.compile(r"^functions\.(?P<name>[^:\s]+):(?P<idx>\d+)$")

# K2.5's provider trait (`ProviderTraits.get`; its vote rule: probe.py): the server's
# detokenizer puts a space before every added token and before the first ordinary token after
# one (vLLM's default `spaces_between_special_tokens` with a slow tokenizer such as Kimi's,
# vllm-project/vllm#33457): reasoning and content begin with a space the model never wrote. A
# request that sent `spaces_between_special_tokens: false` to a server that honours it has
# none, whatever the probe found.
SPACES_AROUND_ADDED_TOKENS = "spaces_around_added_tokens"


@dataclass
class Assembled:
    """A completion rebuilt as ids, with what it was built from and what was noticed."""

    ids: list[int]
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]  # with the ids that are in `ids`
    api_tool_calls: list[ToolCall]  # as the API gave them, or as parsed from raw markers
    flags: list[str] = field(default_factory=list)


def tojson(value: Any, separators: tuple[str, str] | None = None) -> str:
    """Hugging Face's `tojson` template filter (not Jinja's HTML-escaping one)."""
    return json.dumps(value, ensure_ascii=False, separators=separators)


def count_history_tool_calls(messages: Sequence[dict[str, Any]]) -> int:
    """Tool calls already in the conversation: the first index the model gives a new call."""
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")

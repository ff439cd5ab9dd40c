"""What the endpoint probe needs to know about K2.5 (`chat_format.ProbeRules`).

The probe (`specregen.probe`) asks an endpoint how it returns tool calls and reads the
provider's parser traits off the answers; which text is a raw tool section, which id form the
model writes, which placeholder a parser deletes, and how the returned fields are assembled
without repair are K2.5's facts, kept here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specregen.models.chat_format import AssembledLike, ChatFormat, RawCalls
from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    CANONICAL_ID,
    SECTION_BEGIN,
    SECTION_END,
    THINK_END,
    count_history_tool_calls,
)
from specregen.models.kimi_k25.format import (
    THINKING_SWITCH,
    KimiK25,
    find_tool_section,
    has_marker_text,
)
from specregen.models.kimi_k25.readings import NO_CONTENT, looks_stripped, remove_inserted_spaces
from specregen.records import Completion

_ID_INDEX = re.compile(r":(\d+)\s*$")
_RAW_CALL = re.compile(
    re.escape(CALL_BEGIN) + "(.*?)" + re.escape(ARG_BEGIN) + "(.*?)" + re.escape(CALL_END),
    re.DOTALL,
)


class KimiProbeRules:
    """K2.5's answers to the probe's format questions (stateless)."""

    id_form = "functions.NAME:IDX"
    # What vLLM's kimi_k2 tool parser deletes from content when the answer has calls (issue 8).
    placeholder: str | None = NO_CONTENT
    reasoning_end = THINK_END
    thinking_switch = THINKING_SWITCH
    # Kimi's tokenizer is a slow one whose markers are added tokens: a vLLM with its default
    # detokenizer settings puts spaces around them (docs/vllm-0.32.md, section 1.2).
    extra_findings = frozenset({"spaces_around_added_tokens"})
    # Flags of the unrepaired assembly that change what is counted, or say the fields are not
    # what the model wrote: such an answer is no base for learning how the provider counts.
    uncountable_flags = frozenset({"markers_in_text", "tool_calls_in_reasoning",
                                   "think_tag_in_text"})

    def raw_calls(self, text: str | None, *, truncated: bool) -> RawCalls | None:
        if not has_marker_text(text):
            return None
        assert text is not None
        section = find_tool_section(text, allow_partial=truncated)
        if section is None:
            start = text.find(SECTION_BEGIN)
            return RawCalls(start if start != -1 else len(text), [], False)
        return RawCalls(section.start, list(section.calls), True)

    def looks_stripped(self, content: str | None) -> bool:
        return looks_stripped(content)

    def id_is_canonical(self, call_id: str | None, name: str, index: int) -> bool:
        return bool(call_id) and CANONICAL_ID.match(call_id or "") is not None

    def id_index(self, call_id: str | None) -> int | None:
        """The IDX of an id ending in `:IDX` (`functions.f:3`, `f:3`), else None."""
        match = _ID_INDEX.search(call_id or "")
        return int(match.group(1)) if match else None

    def written_calls(self, text: str) -> list[tuple[str, str]]:
        start = text.find(SECTION_BEGIN)
        if start == -1:
            return []
        end = text.find(SECTION_END, start)
        section = text[start : end if end != -1 else len(text)]
        return [(m.group(1), m.group(2)) for m in _RAW_CALL.finditer(section)]

    def calls_start(self, text: str) -> int | None:
        start = text.find(SECTION_BEGIN)
        return None if start == -1 else start

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return count_history_tool_calls(messages)

    def assemble_as_returned(self, fmt: ChatFormat, completion: Completion, *, thinking: bool,
                             truncated: bool, history: int) -> AssembledLike:
        if not isinstance(fmt, KimiK25):
            raise TypeError(f"the K2.5 probe rules need the K2.5 format, not {fmt.name}")
        return fmt.assemble(completion.reasoning if thinking else None, completion.content,
                            completion.tool_calls, thinking=thinking, truncated=truncated,
                            first_tool_index=history)

    def without_inserted_spaces(self, completion: Completion, *, thinking: bool,
                                streamed: bool) -> Completion | None:
        despaced = remove_inserted_spaces(completion, list(completion.tool_calls),
                                          thinking=thinking, streamed=streamed)
        if despaced is None:
            return None
        fields, calls = despaced
        return replace(fields, tool_calls=calls)


RULES = KimiProbeRules()


def make_probe_rules() -> KimiProbeRules:
    return RULES

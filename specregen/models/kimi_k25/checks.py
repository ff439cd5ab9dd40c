"""The K2.5 rules the tool-call gate holds completions to: where its special ids may stand,
the `functions.NAME:IDX` id rule, and the marker text that must not appear as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specregen.models.chat_format import CallStructure, whole_calls
from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    CANONICAL_ID,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
    TOOL_MARKERS,
    count_history_tool_calls,
)
from specregen.records import ToolCall

MARKER_STRINGS = (*TOOL_MARKERS, THINK, THINK_END)
STRUCTURE_TOKENS = (*TOOL_MARKERS, THINK, THINK_END, IM_END)


def call_structure(ids: Sequence[int], marker_ids: dict[str, int], base_vocab_size: int, *,
                   n_calls: int, thinking: bool, truncated: bool) -> CallStructure:
    """Special ids where the K2.5 completion layout puts them, and nowhere else."""
    # Added tokens sit above the BPE ranks (check_tokenizer makes sure): one pass picks out the
    # few of them, where counting each token over the whole list would take a pass per token.
    specials = [t for t in ids if t >= base_vocab_size]
    counts = {name: specials.count(marker_ids[name]) for name in STRUCTURE_TOKENS}
    problems = []
    n = n_calls
    if counts[THINK]:
        problems.append(f"{THINK} id inside the completion (it is prefilled in the prompt)")
    if truncated and counts[IM_END]:
        problems.append(f"a truncated completion holds {IM_END}")
    if not truncated and (counts[IM_END] != 1 or list(ids[-1:]) != [marker_ids[IM_END]]):
        problems.append(f"{IM_END} is not the one last id ({counts[IM_END]} found)")
    if counts[THINK_END] > (1 if thinking else 0):
        problems.append(f"{counts[THINK_END]} {THINK_END} id(s) in a completion with "
                        f"thinking={'on' if thinking else 'off'}")
    begin, call, arg, end, close = (counts[m] for m in (SECTION_BEGIN, CALL_BEGIN, ARG_BEGIN,
                                                         CALL_END, SECTION_END))
    if n == 0:
        expected_ok = call == arg == end == close == 0 and begin <= (1 if truncated else 0)
    elif not truncated:
        expected_ok = begin == close == 1 and call == arg == end == n
    else:
        expected_ok = (begin == 1 and call == n and n - 1 <= end <= arg <= n
                       and close <= 1 and (close == 0 or end == n))
    if not expected_ok:
        problems.append(
            f"marker ids (section {begin}/{close}, call {call}, argument {arg}, end {end}) do "
            f"not fit {n} call(s)"
        )
    # A cut may leave the last call without its argument marker (id cut) or its end marker
    # (arguments cut).
    return CallStructure(problems, whole_calls(n, arg, truncated), whole_calls(n, end, truncated))


def tool_id_problems(calls: Sequence[ToolCall], messages: list[dict[str, Any]] | None
                     ) -> list[str]:
    """K2.5's template numbers calls `functions.NAME:IDX` on from the conversation's earlier
    calls, in plain decimal (never "07" or non-ASCII digits)."""
    first = count_history_tool_calls(messages or [])
    problems = []
    for k, call in enumerate(calls):
        match = CANONICAL_ID.fullmatch(call.id)
        idx = match["idx"] if match is not None else ""
        if match is None or not idx.isascii() or (idx != "0" and idx.startswith("0")):
            problems.append(f"call {k}: id {call.id!r} is not functions.NAME:IDX")
        elif match["name"] != call.name:
            problems.append(f"call {k}: id {call.id!r} names {match['name']!r}, the call is "
                            f"{call.name!r}")
        elif int(idx) != first + k:
            problems.append(f"call {k}: id {call.id!r} has index {idx}, expected "
                            f"{first + k} ({first} earlier call(s) in the conversation)")
    return problems


def find_marker_text(text: str | None) -> str | None:
    """The first K2.5 marker string written as text in `text`, if any."""
    # One scan for the two shapes rules out the common case before the exact search.
    if not text or ("<|tool_call" not in text and "think>" not in text):
        return None
    for marker in MARKER_STRINGS:
        if marker in text:
            return marker
    return None

"""The per-sample checks: one TokenSample in, `accepted` or `quarantined` with reasons out.

Every check sees the calls that are in the ids (`TokenSample.tool_calls`, after the id policy).
A truncated sample may end inside its last call; that call is exempt from the checks that need it
whole (its id while the id is cut, its arguments while they are cut), since it is exactly what the
model wrote before the cut.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specregen.gate.config import GateConfig
from specregen.gate.declared import Declared, declared_tools
from specregen.jsonkind import json_kind
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
    KimiK25,
    count_history_tool_calls,
    find_tool_section,
)
from specregen.reconstruct import TRUST_BREAKING_FLAGS
from specregen.records import TokenSample, ToolCall
from specregen.sources._common import strict_json_loads

CHECKS = (
    "reconstruction",
    "round_trip",
    "arguments_json",
    "arguments_schema",
    "schema_invalid",
    "name_declared",
    "tool_id_form",
    "marker_text",
    "finish_reason",
    "usage_lengths",
)

MARKER_STRINGS = (*TOOL_MARKERS, THINK, THINK_END)
_STRUCTURE_TOKENS = (*TOOL_MARKERS, THINK, THINK_END, IM_END)
# The template's counter writes plain decimal indices, never "07" or non-ASCII digits.
_TOOL_ID = re.compile(r"functions\.(?P<name>[^:\s]+):(?P<idx>0|[1-9][0-9]*)")
_EXCERPT_CHARS = 160


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a sample is quarantined: the check, a short detail, and a piece of the evidence."""

    check: str
    detail: str
    excerpt: str = ""

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}"


@dataclass(frozen=True, slots=True)
class GateDecision:
    sample_id: str
    reasons: tuple[Reason, ...]
    # A round-trip mismatch on a sample reconstruction called `ok`: a reconstruction bug, which
    # fails the dataset whatever the threshold.
    hard: bool = False
    schema_quirks: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else "quarantined"

    def reason_strings(self) -> list[str]:
        return [str(r) for r in self.reasons]


def check_sample(sample: TokenSample, fmt: KimiK25, config: GateConfig) -> GateDecision:
    """Run every check on one sample."""
    if sample.status == "error":
        detail = f"error: {sample.error or 'reconstruction failed'}"
        return GateDecision(sample.sample_id, (Reason("reconstruction", _clip(detail)),))
    reasons: list[Reason] = []
    if sample.status != "ok":
        reasons.append(_reconstruction(sample))
    ids = sample.input_ids[sample.prompt_len :]
    counts = _special_counts(ids, fmt)
    truncated = sample.finish_reason == "length"
    calls = sample.tool_calls
    # How many calls are whole: a cut may leave the last one without its argument marker
    # (id cut) or without its end marker (arguments cut).
    with_id = _whole(calls, counts[ARG_BEGIN], truncated)
    with_args = _whole(calls, counts[CALL_END], truncated)

    trip = _round_trip(sample, fmt, ids, counts, truncated)
    hard = trip is not None and sample.status == "ok"
    declared = declared_tools(sample.tools, sample.messages)
    schema_reasons, quirks = _arguments(calls[:with_args], declared)
    for reason in (
        trip,
        *schema_reasons,
        _names(calls[:with_id], declared),
        _tool_ids(calls[:with_id], sample.messages),
        _marker_text(sample),
        _finish_reason(sample, len(calls), config),
        _usage(sample, config),
    ):
        if reason is not None:
            reasons.append(reason)
    return GateDecision(sample.sample_id, tuple(reasons), hard, quirks)


def _special_counts(ids: list[int], fmt: KimiK25) -> dict[str, int]:
    # Added tokens sit above the BPE ranks (check_tokenizer makes sure): one pass picks out the
    # few of them, where counting each token over the whole list would take a pass per token.
    base = fmt.tok.base_vocab_size
    specials = [t for t in ids if t >= base]
    return {name: specials.count(fmt.ids[name]) for name in _STRUCTURE_TOKENS}


def _whole(calls: list[ToolCall], closing_markers: int, truncated: bool) -> int:
    if truncated and calls and closing_markers < len(calls):
        return len(calls) - 1
    return len(calls)


# --- reconstruction ---------------------------------------------------------------------------


def _reconstruction(sample: TokenSample) -> Reason:
    breaking = [f for f in sample.flags if f in TRUST_BREAKING_FLAGS] or sample.flags
    detail = f"{sample.status}: " + (", ".join(breaking) or "no flag recorded")
    return Reason("reconstruction", detail, _excerpt(sample.content or sample.reasoning))


# --- round trip -------------------------------------------------------------------------------


def _round_trip(
    sample: TokenSample, fmt: KimiK25, ids: list[int], counts: dict[str, int], truncated: bool
) -> Reason | None:
    """Decode the completion, parse its tool section back, compare with what the API returned."""
    problems = _structure(sample, ids, counts, fmt, truncated)
    try:
        text = fmt.tok.decode(ids)
    except KeyError as exc:
        return Reason(
            "round_trip",
            f"the completion ids do not decode with tokenizer {fmt.tok.name!r} ({exc.args[0]}); "
            "were they built with another tokenizer?",
        )
    section = find_tool_section(text, allow_partial=truncated)
    back = section.calls if section is not None else []
    problems += _compare_calls(back, sample.api_tool_calls, sample.tool_calls)
    if not problems:
        return None
    start = section.start if section is not None else max(0, text.find(SECTION_BEGIN))
    more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
    return Reason("round_trip", _clip("; ".join(problems[:2]) + more), _excerpt(text[start:]))


def _structure(
    sample: TokenSample, ids: list[int], counts: dict[str, int], fmt: KimiK25, truncated: bool
) -> list[str]:
    """Special ids where the completion layout puts them, and nowhere else."""
    problems = []
    n = len(sample.tool_calls)
    if counts[THINK]:
        problems.append(f"{THINK} id inside the completion (it is prefilled in the prompt)")
    if truncated and counts[IM_END]:
        problems.append(f"a truncated completion holds {IM_END}")
    if not truncated and (counts[IM_END] != 1 or ids[-1:] != [fmt.ids[IM_END]]):
        problems.append(f"{IM_END} is not the one last id ({counts[IM_END]} found)")
    if counts[THINK_END] > (1 if sample.thinking else 0):
        problems.append(f"{counts[THINK_END]} {THINK_END} id(s) in a completion with "
                        f"thinking={'on' if sample.thinking else 'off'}")
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
    return problems


def _compare_calls(back: list[ToolCall], api: list[ToolCall], ours: list[ToolCall]) -> list[str]:
    problems = []
    if not len(back) == len(api) == len(ours):
        problems.append(f"{len(back)} call(s) parse back from the ids, the API returned "
                        f"{len(api)}, the ids were built from {len(ours)}")
    for k, (got, sent, built) in enumerate(zip(back, api, ours, strict=False)):
        if got.id != built.id.strip():
            problems.append(f"call {k}: id {got.id!r} parses back, {built.id.strip()!r} was built")
        if got.name != sent.name:
            problems.append(f"call {k}: name {got.name!r} parses back from the id, the API "
                            f"returned {sent.name!r}")
        expected = sent.arguments.strip()
        if got.arguments != expected:
            at = _first_difference(got.arguments, expected)
            problems.append(f"call {k}: arguments differ from the API's at character {at} "
                            f"({got.arguments[at : at + 20]!r} vs {expected[at : at + 20]!r})")
    return problems


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


# --- arguments --------------------------------------------------------------------------------


def _arguments(calls: list[ToolCall], declared: Declared) -> tuple[list[Reason], tuple[str, ...]]:
    """arguments_json, arguments_schema and schema_invalid, one reason each at most."""
    bad_json: list[Reason] = []
    bad_schema: list[Reason] = []
    invalid: list[Reason] = []
    quirks: list[str] = []
    for k, call in enumerate(calls):
        where = f"call {k} ({call.name})"
        value, problem = parse_arguments(call.arguments)
        if problem is not None:
            bad_json.append(Reason("arguments_json", f"{where}: {problem}",
                                   _excerpt(call.arguments)))
            continue
        if call.name not in declared.schemas:
            continue  # name_declared reports it; there is no schema to hold it to
        outcome = declared.validate(call.name, value, call.arguments)
        quirks.extend(outcome.quirks)
        if outcome.problem is not None:
            schema_text = json.dumps(declared.schemas[call.name], ensure_ascii=False)
            invalid.append(Reason("schema_invalid", f"tool {call.name!r}: {outcome.problem}",
                                  _excerpt(schema_text)))
        elif outcome.error is not None:
            bad_schema.append(Reason("arguments_schema", f"{where}: {outcome.error}",
                                     _excerpt(call.arguments)))
    reasons = [_first_of(group) for group in (bad_json, bad_schema, invalid) if group]
    return reasons, tuple(dict.fromkeys(quirks))


def parse_arguments(text: str) -> tuple[Any, str | None]:
    """The arguments as a JSON object, or why they are not one."""
    try:
        value = strict_json_loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg}; character {exc.pos})"
    except ValueError as exc:  # NaN / Infinity
        return None, f"not JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"a JSON {json_kind(value)}, not an object"
    return value, None




def _first_of(reasons: list[Reason]) -> Reason:
    if len(reasons) == 1:
        return reasons[0]
    first = reasons[0]
    return Reason(first.check, f"{first.detail} (+{len(reasons) - 1} more calls)", first.excerpt)


# --- names and ids ----------------------------------------------------------------------------


def _names(calls: list[ToolCall], declared: Declared) -> Reason | None:
    undeclared = [c.name for c in calls if c.name not in declared.schemas]
    if not undeclared:
        return None
    where = {"tools": "in tools", "system_prompt": "in the system prompt"}.get(
        declared.source, "(no tools, and the system prompt declares none)"
    )
    detail = f"{undeclared[0]!r} is not declared {where}; declared: {declared.describe()}"
    if declared.problem:
        detail += f" (the declaration could not be read: {declared.problem})"
    if len(undeclared) > 1:
        detail += f" (+{len(undeclared) - 1} more calls)"
    return Reason("name_declared", _clip(detail), _excerpt(calls[0].arguments))


def _tool_ids(calls: list[ToolCall], messages: list[dict[str, Any]] | None) -> Reason | None:
    first = count_history_tool_calls(messages or [])
    problems = []
    for k, call in enumerate(calls):
        match = _TOOL_ID.fullmatch(call.id)
        if match is None:
            problems.append(f"call {k}: id {call.id!r} is not functions.NAME:IDX")
        elif match["name"] != call.name:
            problems.append(f"call {k}: id {call.id!r} names {match['name']!r}, the call is "
                            f"{call.name!r}")
        elif int(match["idx"]) != first + k:
            problems.append(f"call {k}: id {call.id!r} has index {match['idx']}, expected "
                            f"{first + k} ({first} earlier call(s) in the conversation)")
    if not problems:
        return None
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return Reason("tool_id_form", _clip(problems[0] + more), _excerpt(calls[0].id))


# --- text, finish reason, usage ---------------------------------------------------------------


def _marker_text(sample: TokenSample) -> Reason | None:
    fields = [("reasoning", sample.reasoning), ("content", sample.content)]
    fields += [(f"call {k} arguments", c.arguments) for k, c in enumerate(sample.tool_calls)]
    for where, text in fields:
        # One scan for the two shapes rules out the common case before the exact search.
        if not text or ("<|tool_call" not in text and "think>" not in text):
            continue
        for marker in MARKER_STRINGS:
            at = text.find(marker)
            if at != -1:
                window = text[max(0, at - 60) : at + len(marker) + 60]
                return Reason("marker_text", f"{where} holds the marker text {marker}",
                              _excerpt(window))
    return None


def _finish_reason(sample: TokenSample, n_calls: int, config: GateConfig) -> Reason | None:
    reason = sample.finish_reason
    detail: str | None = None
    if reason == "length":
        if not config.accept_truncated:
            detail = "'length': the sample is truncated and accept_truncated is off"
    elif reason == "tool_calls":
        if not n_calls:
            detail = "'tool_calls' but the completion holds no call"
    elif reason == "stop":
        # A provider that did not parse the calls (they came back as raw markers in the text)
        # cannot know they were calls: `stop` is what it reports, and no disagreement.
        raw_calls = "tool_calls_in_content" in sample.flags
        if n_calls and not raw_calls and not config.allow_stop_with_calls:
            detail = f"'stop' with {n_calls} call(s), and allow_stop_with_calls is off"
    else:
        detail = f"{reason!r} is none of 'stop', 'tool_calls', 'length'"
    if detail is None:
        return None
    tail = (sample.content or sample.reasoning or "")[-_EXCERPT_CHARS:]
    return Reason("finish_reason", detail, _excerpt(tail))


def _usage(sample: TokenSample, config: GateConfig) -> Reason | None:
    problems = []
    delta = sample.usage_prompt_delta
    if delta is not None and abs(delta) > config.prompt_tolerance:
        problems.append(f"prompt {sample.prompt_len} tokens, usage says {sample.prompt_len - delta}"
                        f" ({delta:+d}, allowed ±{config.prompt_tolerance})")
    delta = sample.usage_completion_delta
    if delta is not None:
        reported = sample.completion_len - delta
        allowed = max(config.completion_tolerance_abs, config.completion_tolerance_rel * reported)
        if abs(delta) > allowed:
            problems.append(f"completion {sample.completion_len} tokens, usage says {reported} "
                            f"({delta:+d}, allowed ±{allowed:g})")
    if not problems:
        return None
    return Reason("usage_lengths", "; ".join(problems))


def _excerpt(text: str | None) -> str:
    if not text:
        return ""
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 1] + "…"


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

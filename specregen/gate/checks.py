"""The per-sample checks: one TokenSample in, `accepted` or `quarantined` with reasons out.

Every check sees the calls that are in the ids (`TokenSample.tool_calls`, after the id policy).
A truncated sample may end inside its last call; that call is exempt from the checks that need it
whole (its id while the id is cut, its arguments while they are cut), since it is exactly what the
model wrote before the cut.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specregen.gate.config import GateConfig
from specregen.gate.declared import Declared, declared_tools
from specregen.jsonkind import json_kind, strict_json_loads
from specregen.models.chat_format import ChatFormat
from specregen.reconstruct import TRUST_BREAKING_FLAGS
from specregen.records import EVIDENCE_LEVELS, Declaration, TokenSample, ToolCall

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
    "evidence",
)

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


def check_sample(sample: TokenSample, fmt: ChatFormat, config: GateConfig,
                 declaration: Declaration | None = None) -> GateDecision:
    """Run every check on one sample; `declaration`: what its prompt declares (its adapter's
    statement, `Prompt.declaration`), else the tools its request sent are the declaration."""
    if sample.status == "error":
        detail = f"error: {sample.error or 'reconstruction failed'}"
        return GateDecision(sample.sample_id, (Reason("reconstruction", _clip(detail)),))
    reasons: list[Reason] = []
    if sample.status != "ok":
        reasons.append(_reconstruction(sample))
    ids = sample.input_ids[sample.prompt_len :]
    truncated = sample.finish_reason == "length"
    calls = sample.tool_calls
    # The format's layout rules; how many calls are whole (a cut may leave the last one open).
    structure = fmt.call_structure(ids, n_calls=len(calls), thinking=bool(sample.thinking),
                                   truncated=truncated)
    with_id, with_args = structure.whole_ids, structure.whole_args

    trip = _round_trip(sample, fmt, ids, structure.problems, truncated)
    hard = trip is not None and sample.status == "ok"
    declared = declared_tools(sample, declaration)
    schema_reasons, quirks = _arguments(calls[:with_args], declared)
    for reason in (
        trip,
        *schema_reasons,
        _names(calls[:with_id], declared),
        _tool_ids(calls[:with_id], sample.messages, fmt),
        _marker_text(sample, fmt),
        _finish_reason(sample, len(calls), config),
        _usage(sample, config),
        _evidence(sample, config),
    ):
        if reason is not None:
            reasons.append(reason)
    if sample.conversation_id is not None:
        history_reasons, history_quirks = _history_answers(sample, fmt, declared)
        reasons += history_reasons
        quirks = tuple(dict.fromkeys((*quirks, *history_quirks)))
    return GateDecision(sample.sample_id, tuple(reasons), hard, quirks)


# --- reconstruction ---------------------------------------------------------------------------


def _reconstruction(sample: TokenSample) -> Reason:
    breaking = [f for f in sample.flags if f in TRUST_BREAKING_FLAGS] or sample.flags
    detail = f"{sample.status}: " + (", ".join(breaking) or "no flag recorded")
    return Reason("reconstruction", detail, _excerpt(sample.content or sample.reasoning))


# --- round trip -------------------------------------------------------------------------------


def _round_trip(
    sample: TokenSample, fmt: ChatFormat, ids: list[int], problems: list[str], truncated: bool
) -> Reason | None:
    """Decode the completion, parse its calls back, compare with what the API returned."""
    problems = list(problems)
    try:
        text = fmt.tok.decode(ids)
    except KeyError as exc:
        return Reason(
            "round_trip",
            f"the completion ids do not decode with tokenizer {fmt.tok.name!r} ({exc.args[0]}); "
            "were they built with another tokenizer?",
        )
    parsed = fmt.parse_tool_calls(text, truncated=truncated)
    back = parsed.calls if parsed is not None else []
    problems += _compare_calls(back, sample.api_tool_calls, sample.tool_calls, fmt)
    if not problems:
        return None
    start = parsed.start if parsed is not None else max(0, text.find(fmt.calls_open))
    more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
    return Reason("round_trip", _clip("; ".join(problems[:2]) + more), _excerpt(text[start:]))


def _compare_calls(back: list[ToolCall], api: list[ToolCall], ours: list[ToolCall],
                   fmt: ChatFormat) -> list[str]:
    problems = []
    if not len(back) == len(api) == len(ours):
        problems.append(f"{len(back)} call(s) parse back from the ids, the API returned "
                        f"{len(api)}, the ids were built from {len(ours)}")
    for k, (got, sent, built) in enumerate(zip(back, api, ours, strict=False)):
        if fmt.tool_id_in_tokens and got.id != built.id.strip():
            problems.append(f"call {k}: id {got.id!r} parses back, {built.id.strip()!r} was built")
        if got.name != sent.name:
            problems.append(f"call {k}: name {got.name!r} parses back from the id, the API "
                            f"returned {sent.name!r}")
        got_args = fmt.comparable_arguments(got.arguments)
        expected = fmt.comparable_arguments(sent.arguments)
        if got_args != expected:
            at = _first_difference(got_args, expected)
            problems.append(f"call {k}: arguments differ from the API's at character {at} "
                            f"({got_args[at : at + 20]!r} vs {expected[at : at + 20]!r})")
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


def _tool_ids(calls: list[ToolCall], messages: list[dict[str, Any]] | None,
              fmt: ChatFormat) -> Reason | None:
    problems = fmt.tool_id_problems(calls, messages)
    if not problems:
        return None
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return Reason("tool_id_form", _clip(problems[0] + more), _excerpt(calls[0].id))


# --- a conversation's earlier answers -----------------------------------------------------------


def turn_history_answers(sample: TokenSample) -> list[tuple[int, list[ToolCall]]]:
    """A conversation sample's earlier answers of its user turn, as (message index, calls):
    the assistant messages after the turn's user message(s), which sit in the prompt under the
    loss mask (specregen/conversation/samples.py). Empty for a single-turn sample, whose
    history is the dataset's, not the model's."""
    if sample.conversation_id is None or not sample.messages:
        return []
    messages = sample.messages
    start = 1 + max((i for i, m in enumerate(messages) if isinstance(m, dict)
                     and m.get("role") in ("user", "system")), default=-1)
    return [(i, _message_calls(messages[i])) for i in range(start, len(messages))
            if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"]


def _message_calls(message: dict[str, Any]) -> list[ToolCall]:
    out = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        args = fn.get("arguments")
        out.append(ToolCall(id=str(call.get("id") or "") if isinstance(call, dict) else "",
                            name=str(fn.get("name") or ""),
                            arguments=args if isinstance(args, str) else json.dumps(args)))
    return out


def _history_answers(sample: TokenSample, fmt: ChatFormat,
                     declared: Declared) -> tuple[list[Reason], tuple[str, ...]]:
    """The per-call checks on each earlier answer of the sample's user turn: its calls are
    model output the sample trains on, like the completion's (ids counted on from the calls
    before that answer in the conversation)."""
    reasons: list[Reason] = []
    quirks: list[str] = []
    for index, calls in turn_history_answers(sample):
        if not calls:
            continue
        found, seen = _arguments(calls, declared)
        quirks.extend(seen)
        for reason in (*found, _names(calls, declared),
                       _tool_ids(calls, (sample.messages or [])[:index], fmt)):
            if reason is not None:
                reasons.append(Reason(reason.check, _clip(
                    f"history answer messages[{index}]: {reason.detail}"), reason.excerpt))
    return reasons, tuple(quirks)


# --- text, finish reason, usage ---------------------------------------------------------------


def _marker_text(sample: TokenSample, fmt: ChatFormat) -> Reason | None:
    if sample.evidence == "reference":
        return None  # the server's own ids matched: the marker text is what the model wrote
    fields = [("reasoning", sample.reasoning), ("content", sample.content)]
    fields += [(f"call {k} arguments", c.arguments) for k, c in enumerate(sample.tool_calls)]
    for where, text in fields:
        marker = fmt.find_marker_text(text)
        if marker is not None and text is not None:  # (None holds no marker)
            at = text.find(marker)
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
    tol = config.tolerance
    delta = sample.usage_prompt_delta
    if delta is not None and abs(delta) > tol.prompt:
        problems.append(f"prompt {sample.prompt_len} tokens, usage says {sample.prompt_len - delta}"
                        f" ({delta:+d}, allowed ±{tol.prompt})")
    delta = sample.usage_completion_delta
    if delta is not None:
        reported = sample.completion_len - delta
        allowed = tol.completion_allowed(reported)
        if abs(delta) > allowed:
            problems.append(f"completion {sample.completion_len} tokens, usage says {reported} "
                            f"({delta:+d}, allowed ±{allowed:g})")
    if not problems:
        return None
    return Reason("usage_lengths", "; ".join(problems))


def _evidence(sample: TokenSample, config: GateConfig) -> Reason | None:
    # Files written before evidence existed say nothing: that is no evidence.
    have = sample.evidence or "none"
    if EVIDENCE_LEVELS.index(have) <= EVIDENCE_LEVELS.index(config.min_evidence):
        return None
    return Reason("evidence", f"evidence `{have}`, the dataset needs `{config.min_evidence}` or "
                              "stronger")


def _excerpt(text: str | None) -> str:
    if not text:
        return ""
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 1] + "…"


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

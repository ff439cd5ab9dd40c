"""Pure judgement of probe responses: where the tool calls came back and what survived.

Where calls came back, per response (first rule that applies):

1. `structured`: `message.tool_calls` is not empty.
2. `raw_content`: tool-call marker text is in `content` (`raw_section_parsed` says whether it
   parses as a section, see `find_tool_section`).
3. `raw_reasoning`: marker text is in the reasoning (the model opened the section before
   closing its thinking; vLLM then puts everything into reasoning, SPEC 3.1).
4. `stripped`: no calls and no markers, yet `finish_reason` is `tool_calls` or the content reads
   like a call whose markers were deleted (`looks_stripped`).
5. `none`: no call at all.

A response with a call is recoverable when it is `structured` (unless the model's token ids,
where the server returns them, prove the arguments were re-serialised or changed) or a raw
section that parses; `stripped` never is.

A scenario takes the worst case of its responses (stripped > raw_reasoning > raw_content >
structured), because one unrecoverable answer in a paid run is one lost sample.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK_END,
    FormatError,
    KimiK25,
    count_history_tool_calls,
    find_tool_section,
    has_marker_text,
    looks_stripped,
    resolve_tool_id,
)
from specregen.normalize import ResponseError, normalize_response, thinking_from_request
from specregen.probe.model import (
    ArgumentsCheck,
    ArgumentsJson,
    CallsWhere,
    ContentKind,
    IdForm,
    Observation,
    ReasoningField,
    ScenarioResult,
    ToolMode,
    Whitespace,
)
from specregen.records import Completion, ToolCall

CANONICAL_ID_FORM: IdForm = "functions.NAME:IDX"
RAW_WHERE = ("raw_content", "raw_reasoning")
_WHERE_RANK = {"none": 0, "structured": 1, "raw_content": 2, "raw_reasoning": 3, "stripped": 4}
_ARGS_RANK = {"none": 0, "verbatim": 1, "unknown": 2, "trimmed": 3, "reserialized": 4,
              "changed": 5}
_WS_RANK = {"none": 0, "kept": 1, "unknown": 2, "lost": 3}
_ID_INDEX = re.compile(r":(\d+)\s*$")
# What vLLM's kimi_k2 tool parser deletes from content when the answer has calls (issue 8).
NO_CONTENT = "(no content)"
# Flags of the unrepaired assembly that change what is counted, or say the fields are not what
# the model wrote: such an answer is no base for learning how the provider counts.
_UNCOUNTABLE_FLAGS = frozenset({"markers_in_text", "tool_calls_in_reasoning",
                                "think_tag_in_text"})
_RAW_CALL = re.compile(
    re.escape(CALL_BEGIN) + "(.*?)" + re.escape(ARG_BEGIN) + "(.*?)" + re.escape(CALL_END),
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class CallsFinding:
    where: CallsWhere
    calls: list[ToolCall]  # structured, or parsed from the raw markers
    raw_section_parsed: bool | None  # None when no raw section was involved


def classify_calls(completion: Completion) -> CallsFinding:
    """Where the calls of one normalised response are (see the module docstring)."""
    if completion.tool_calls:
        return CallsFinding("structured", list(completion.tool_calls), None)
    truncated = completion.finish_reason == "length"
    for where, text in (("raw_content", completion.content),
                        ("raw_reasoning", completion.reasoning)):
        if has_marker_text(text):
            assert text is not None
            section = find_tool_section(text, allow_partial=truncated)
            calls = section.calls if section is not None else []
            return CallsFinding(where, calls, section is not None)  # type: ignore[arg-type]
    if completion.finish_reason == "tool_calls" or looks_stripped(completion.content):
        return CallsFinding("stripped", [], None)
    return CallsFinding("none", [], None)


def reasoning_field_of(completion: Completion) -> ReasoningField:
    """The field the reasoning text came in; "none" when there was no reasoning text."""
    if completion.reasoning and completion.reasoning_field:
        return completion.reasoning_field  # type: ignore[return-value]
    return "none"


def id_form_of(calls: Sequence[ToolCall]) -> tuple[IdForm, str | None]:
    """`functions.NAME:IDX` when every id has that form, else "other", with an example id."""
    if not calls:
        return "none", None
    for k, call in enumerate(calls):
        if resolve_tool_id(call.id, call.name, k)[1]:
            return "other", call.id
    return CANONICAL_ID_FORM, calls[0].id


def arguments_json_of(calls: Sequence[ToolCall]) -> ArgumentsJson:
    if not calls:
        return "none"
    for call in calls:
        try:
            json.loads(call.arguments)
        except (TypeError, ValueError):
            return "invalid"
    return "valid"


def raw_calls_in(text: str) -> list[tuple[str, str]]:
    """(id, arguments) of each call in the first marker section of `text`, untrimmed."""
    start = text.find(SECTION_BEGIN)
    if start == -1:
        return []
    end = text.find(SECTION_END, start)
    section = text[start : end if end != -1 else len(text)]
    return [(m.group(1), m.group(2)) for m in _RAW_CALL.finditer(section)]


def compare_with_raw(
    api: Sequence[ToolCall], raw: Sequence[tuple[str, str]]
) -> tuple[ArgumentsCheck, Whitespace]:
    """Structured calls against the marker text the model wrote (decoded from token ids)."""
    if len(api) != len(raw):
        return "changed", "unknown"
    check: ArgumentsCheck = "verbatim"
    whitespace: Whitespace = "kept"
    for call, (raw_id, raw_args) in zip(api, raw, strict=True):
        if call.arguments == raw_args:
            kind: ArgumentsCheck = "verbatim"
        elif call.arguments == raw_args.strip():
            kind = "trimmed"
        elif _same_json(call.arguments, raw_args):
            kind = "reserialized"
        else:
            kind = "changed"
        check = _worst(_ARGS_RANK, check, kind)
        # A renumbered or replaced id shows in the id form; only a trimmed one loses whitespace.
        id_trimmed = call.id != raw_id and call.id == raw_id.strip()
        if kind == "trimmed" or id_trimmed:
            seen: Whitespace = "lost"
        elif kind in ("reserialized", "changed"):
            seen = "unknown"  # the text changed anyway; which bytes were whitespace is moot
        else:
            seen = "kept"
        whitespace = _worst(_WS_RANK, whitespace, seen)
    return check, whitespace


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def _has_outer_space(text: str) -> bool:
    return text != text.strip()


def observe(
    index: int,
    request: dict[str, Any],
    response: dict[str, Any],
    *,
    fmt: KimiK25 | None = None,
    latency_s: float = 0.0,
    http_status: int | None = 200,
) -> Observation:
    """Everything one answered probe request tells (token counts only with a tokenizer)."""
    try:
        completion = normalize_response(response)
    except ResponseError as exc:
        return Observation(index=index, ok=False, http_status=http_status,
                           error=f"invalid_response: {exc}", latency_s=latency_s)
    finding = classify_calls(completion)
    id_form, id_example = id_form_of(finding.calls)
    requested = thinking_from_request(request)
    messages = request.get("messages") if isinstance(request.get("messages"), list) else []
    obs = Observation(
        index=index,
        ok=True,
        thinking=requested,
        content_kind=content_kind_of(_before_section(completion.content, finding)),
        history_tool_calls=count_history_tool_calls(messages),
        returned_indices=[id_index(c.id) for c in finding.calls],
        think_end_in_content=bool(completion.content and THINK_END in completion.content
                                  and not completion.reasoning),
        tools_sent=bool(request.get("tools")),
        http_status=http_status,
        calls_where=finding.where,
        tool_calls=len(finding.calls),
        raw_section_parsed=finding.raw_section_parsed,
        reasoning_field=reasoning_field_of(completion),
        reasoning_chars=len(completion.reasoning or ""),
        id_form=id_form,
        id_example=id_example,
        arguments_json=arguments_json_of(finding.calls),
        finish_reason=completion.finish_reason,
        native_finish_reason=completion.native_finish_reason,
        provider=completion.provider if isinstance(completion.provider, str) else None,
        latency_s=latency_s,
        usage_prompt_tokens=_count(completion.usage.get("prompt_tokens")),
        usage_completion_tokens=_count(completion.usage.get("completion_tokens")),
    )
    reference = _reference_ids(response)
    if reference is not None and fmt is not None:
        written = fmt.tok.decode(reference)
        obs.written_indices = [id_index(raw_id) for raw_id, _ in raw_calls_in(written)]
        obs.wrote_placeholder = wrote_placeholder(written)
        start = written.find(SECTION_BEGIN)
        if start != -1 and requested is not False:
            obs.section_in_think = THINK_END not in written[:start]
    if finding.where == "structured":
        if reference is not None and fmt is not None:
            raw = raw_calls_in(fmt.tok.decode(reference))
            obs.arguments, obs.whitespace = compare_with_raw(finding.calls, raw)
        else:
            # Without the model's own text there is nothing to compare with: key order and
            # spacing as written cannot be known. Surrounding whitespace that is still there
            # proves at least that nobody trimmed it.
            obs.arguments = "unknown"
            kept = any(_has_outer_space(c.arguments) or _has_outer_space(c.id)
                       for c in finding.calls)
            obs.whitespace = "kept" if kept else "unknown"
    elif finding.where in RAW_WHERE:
        # The marker text is what the model wrote, as the server detokenized it.
        parsed = bool(finding.raw_section_parsed)
        obs.arguments = "verbatim" if parsed else "unknown"
        obs.whitespace = "kept" if parsed else "unknown"
    if fmt is not None:
        _count_tokens(obs, request, response, fmt, reference)
        _count_raw(obs, request, completion, finding, fmt)
    return obs


def _before_section(content: str | None, finding: CallsFinding) -> str | None:
    # Raw markers left in content: the content the model wrote is what precedes them.
    if finding.where != "raw_content" or not content:
        return content
    section = find_tool_section(content, allow_partial=True)
    return content[: section.start] if section is not None else content


def content_kind_of(content: str | None) -> ContentKind:
    if content is None:
        return "none"
    if not content.strip():
        return "empty"
    return "placeholder" if content.strip() == NO_CONTENT else "text"


def id_index(tool_id: str | None) -> int | None:
    """The IDX of an id ending in `:IDX` (`functions.f:3`, `f:3`), else None."""
    match = _ID_INDEX.search(tool_id or "")
    return int(match.group(1)) if match else None


def wrote_placeholder(text: str) -> bool | None:
    """From the model's own text: whether it wrote `(no content)` before a tool section; None
    when it wrote no section (nothing a parser could delete then)."""
    start = text.find(SECTION_BEGIN)
    if start == -1:
        return None
    before = text[:start]
    cut = before.rfind(THINK_END)
    return before[cut + len(THINK_END) if cut != -1 else 0 :].strip() == NO_CONTENT


def _count_raw(
    obs: Observation,
    request: dict[str, Any],
    completion: Completion,
    finding: CallsFinding,
    fmt: KimiK25,
) -> None:
    """usage minus the returned fields assembled exactly as returned, and whether that answer
    is a clean base for counting. Deliberately not `reconstruct`: the probe must see the
    provider's behaviour, not reconstruction's corrections of it."""
    obs.placeholder_tokens = len(fmt.tok.encode_ordinary(NO_CONTENT))
    reported = _count(completion.usage.get("completion_tokens"))
    thinking = obs.thinking is not False  # the server default is on (SPEC 5)
    truncated = completion.finish_reason == "length"
    try:
        assembled = fmt.assemble(
            completion.reasoning if thinking else None, completion.content,
            completion.tool_calls, thinking=thinking, truncated=truncated,
            first_tool_index=obs.history_tool_calls,
        )
    except (FormatError, KeyError, TypeError, AttributeError):
        return
    if reported is not None:
        obs.raw_completion_offset = reported - len(assembled.ids)
    reasoned = bool(completion.reasoning)
    obs.countable = (
        reported is not None
        and not truncated
        and finding.where in ("structured", "raw_content", "none")
        and (finding.where != "raw_content" or bool(finding.raw_section_parsed))
        and reasoned == thinking  # reasoning dropped, unsplit or forced: not the model's shape
        and not _UNCOUNTABLE_FLAGS.intersection(assembled.flags)
        and not obs.think_end_in_content
        and obs.prompt_offset in (0, None)  # another template or tokenizer: counts say nothing
        and obs.reference_match in (None, "exact")  # non-canonical splits change counts
    )


def failed_observation(
    index: int, error_class: str | None, message: str | None, http_status: int | None,
    latency_s: float,
) -> Observation:
    error = f"{error_class or 'error'}: {message}" if message else (error_class or "error")
    return Observation(index=index, ok=False, http_status=http_status, error=error,
                       latency_s=latency_s)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reference_ids(response: dict[str, Any]) -> list[int] | None:
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    ids = first.get("token_ids") if isinstance(first, dict) else None
    if isinstance(ids, list) and ids and all(type(t) is int for t in ids):
        return ids
    return None


def _count_tokens(
    obs: Observation,
    request: dict[str, Any],
    response: dict[str, Any],
    fmt: KimiK25,
    reference: list[int] | None,
) -> None:
    from specregen.reconstruct import reconstruct

    sample = reconstruct(f"probe-{obs.index}", request, response, fmt,
                         reference_completion_ids=reference)
    if sample.status == "error":
        obs.reconstruct_flags = [f"error: {sample.error}"]
        return
    obs.our_prompt_tokens = sample.prompt_len
    obs.our_completion_tokens = sample.completion_len
    # reconstruct's deltas are ours - usage; the profile reports usage - ours.
    if sample.usage_prompt_delta is not None:
        obs.prompt_offset = -sample.usage_prompt_delta
    if sample.usage_completion_delta is not None:
        obs.completion_offset = -sample.usage_completion_delta
    obs.reference_match = sample.reference_match
    obs.reconstruct_flags = list(sample.flags)


# ---------------------------------------------------------------------------------------------
# Scenario summaries and verdicts


def _worst(rank: dict[str, int], a: Any, b: Any) -> Any:
    return a if rank[a] >= rank[b] else b


def observation_recoverable(obs: Observation) -> bool | None:
    """True/False for a response that made a call; None for one that did not (or failed)."""
    if not obs.ok or obs.calls_where in (None, "none"):
        return None
    if obs.calls_where == "structured":
        # Proven rewriting (from the model's own token ids) loses every call; trimming only
        # the rare call the model wrote with surrounding whitespace, so it stays a note.
        return obs.arguments not in ("reserialized", "changed")
    if obs.calls_where in RAW_WHERE:
        return bool(obs.raw_section_parsed)
    return False


def summarize(result: ScenarioResult, observations: Iterable[Observation]) -> ScenarioResult:
    """Fill the scenario's summary fields from its observations (worst case wins)."""
    result.observations = sorted(observations, key=lambda o: o.index)
    answered = [o for o in result.observations if o.ok]
    result.errors = list(dict.fromkeys(o.error for o in result.observations if o.error))
    if not answered:
        result.calls_where = None
        result.recoverable = None
        return result
    result.where_counts = dict(Counter(o.calls_where for o in answered if o.calls_where))
    where: CallsWhere = "none"
    for o in answered:
        where = _worst(_WHERE_RANK, where, o.calls_where or "none")
    result.calls_where = where
    verdicts = [v for v in map(observation_recoverable, answered) if v is not None]
    result.recoverable = all(verdicts) if verdicts else None
    fields = Counter(o.reasoning_field for o in answered if o.reasoning_field != "none")
    result.reasoning_field = fields.most_common(1)[0][0] if fields else "none"
    other = next((o for o in answered if o.id_form == "other"), None)
    canonical = next((o for o in answered if o.id_form == CANONICAL_ID_FORM), None)
    chosen = other or canonical
    result.id_form = chosen.id_form if chosen else "none"
    result.id_example = chosen.id_example if chosen else None
    jsons = {o.arguments_json for o in answered}
    result.arguments_json = ("invalid" if "invalid" in jsons else
                             "valid" if "valid" in jsons else "none")
    result.arguments, result.whitespace = "none", "none"
    for o in answered:
        result.arguments = _worst(_ARGS_RANK, result.arguments, o.arguments)
        result.whitespace = _worst(_WS_RANK, result.whitespace, o.whitespace)
    result.prompt_offsets = sorted({o.prompt_offset for o in answered
                                    if o.prompt_offset is not None})
    result.completion_offsets = sorted({o.completion_offset for o in answered
                                        if o.completion_offset is not None})
    result.finish_reasons = dict(Counter(str(o.finish_reason) for o in answered))
    result.providers = sorted({o.provider for o in answered if o.provider})
    result.latency_s_max = max(o.latency_s for o in result.observations)
    return result


def mode_scenarios(thinking: bool | None) -> dict[ToolMode, tuple[str, ...]]:
    """The scenarios that speak for each tool mode, given the run's thinking setting."""
    # The thinking scenario that matches the run is more evidence for the `tools` mode; the
    # server default is thinking on (SPEC 5).
    matching = "thinking_off" if thinking is False else "thinking_on"
    return {"tools": ("tools", matching, "history"), "system_prompt": ("system_prompt", "glaive")}


def recoverable_by_mode(
    scenarios: Sequence[ScenarioResult], thinking: bool | None
) -> dict[str, bool]:
    """A mode is recoverable when some scenario of it made calls and none lost any."""
    by_name = {s.name: s for s in scenarios}
    out: dict[str, bool] = {}
    for mode, names in mode_scenarios(thinking).items():
        verdicts = [by_name[n].recoverable for n in names if n in by_name]
        out[mode] = any(v is True for v in verdicts) and not any(v is False for v in verdicts)
    return out


def overall_reasoning_field(scenarios: Sequence[ScenarioResult]) -> ReasoningField:
    """The reasoning field of the scenarios that did not turn thinking off."""
    fields = Counter(s.reasoning_field for s in scenarios
                     if s.thinking is not False and s.reasoning_field != "none")
    return fields.most_common(1)[0][0] if fields else "none"

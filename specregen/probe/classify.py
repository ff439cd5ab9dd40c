"""Pure judgement of probe responses: where the tool calls came back and what survived.

Where calls came back, per response (first rule that applies):

1. `structured`: `message.tool_calls` is not empty.
2. `raw_content`: tool-call marker text is in `content` (`raw_section_parsed` says whether it
   parses as the format's calls, `ProbeRules.raw_calls`).
3. `raw_reasoning`: marker text is in the reasoning (the model opened the section before
   closing its thinking; a parser may then put everything into reasoning).
4. `stripped`: no calls and no markers, yet `finish_reason` is `tool_calls` or the content reads
   like a call whose markers were deleted (`ProbeRules.looks_stripped`).
5. `none`: no call at all.

A response with a call is recoverable when it is `structured` (unless the model's token ids,
where the server returns them, prove the arguments were re-serialised or changed) or a raw
section that parses; `stripped` never is.

A scenario takes the worst case of its responses (stripped > raw_reasoning > raw_content >
structured), because one unrecoverable answer in a paid run is one lost sample.

What is format knowledge (marker text, the id form, the placeholder a parser deletes, assembling
the fields as returned) comes from the format's `ProbeRules` (`models.registry.probe_rules`);
this module names no model family.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specregen.logprobs import ids_from_logprobs
from specregen.models.chat_format import ChatFormat, FormatError
from specregen.models.probe_answer import (
    ArgumentsCheck,
    ArgumentsJson,
    CallsWhere,
    ContentKind,
    IdForm,
    Observation,
    ReasoningField,
    Whitespace,
)
from specregen.models.probe_rules import ProbeRules
from specregen.probe.model import ScenarioResult, ToolMode
from specregen.records import Completion, ToolCall
from specregen.wire.response import ResponseError, normalize_response, thinking_from_request
from specregen.wire.token_ids import server_completion_ids

RAW_WHERE = ("raw_content", "raw_reasoning")
_WHERE_RANK = {"none": 0, "structured": 1, "raw_content": 2, "raw_reasoning": 3, "stripped": 4}
_ARGS_RANK = {"none": 0, "verbatim": 1, "unknown": 2, "trimmed": 3, "reserialized": 4,
              "changed": 5}
_WS_RANK = {"none": 0, "kept": 1, "unknown": 2, "lost": 3}


@dataclass(frozen=True, slots=True)
class CallsFinding:
    where: CallsWhere
    calls: list[ToolCall]  # structured, or parsed from the raw markers
    raw_section_parsed: bool | None  # None when no raw section was involved


def classify_calls(completion: Completion, rules: ProbeRules) -> CallsFinding:
    """Where the calls of one normalised response are (see the module docstring)."""
    if completion.tool_calls:
        return CallsFinding("structured", list(completion.tool_calls), None)
    truncated = completion.finish_reason == "length"
    for where, text in (("raw_content", completion.content),
                        ("raw_reasoning", completion.reasoning)):
        raw = rules.raw_calls(text, truncated=truncated)
        if raw is not None:
            return CallsFinding(where, raw.calls, raw.parsed)  # type: ignore[arg-type]
    if completion.finish_reason == "tool_calls" or rules.looks_stripped(completion.content):
        return CallsFinding("stripped", [], None)
    return CallsFinding("none", [], None)


def reasoning_field_of(completion: Completion) -> ReasoningField:
    """The field the reasoning text came in; "none" when there was no reasoning text."""
    if completion.reasoning and completion.reasoning_field:
        return completion.reasoning_field  # type: ignore[return-value]
    return "none"


def id_form_of(calls: Sequence[ToolCall], rules: ProbeRules) -> tuple[IdForm, str | None]:
    """The format's id form (`rules.id_form`) when every id has it, else "other", with an
    example id."""
    if not calls:
        return "none", None
    for k, call in enumerate(calls):
        if not rules.id_is_canonical(call.id, call.name, k):
            return "other", call.id
    return rules.id_form, calls[0].id


def arguments_json_of(calls: Sequence[ToolCall]) -> ArgumentsJson:
    if not calls:
        return "none"
    for call in calls:
        try:
            json.loads(call.arguments)
        except (TypeError, ValueError):
            return "invalid"
    return "valid"


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


def spaces_by_ids(reasoning: str | None, written: str, rules: ProbeRules) -> bool | None:
    """Whether the returned reasoning is what the model wrote (its decoded ids up to the
    format's reasoning end) with a space put before it: True, as written: False, else None."""
    if not reasoning or not reasoning.strip() or rules.reasoning_end not in written:
        return None
    wrote = written[: written.index(rules.reasoning_end)]
    if not wrote.strip() or wrote.startswith(" "):
        return None  # a model that began with a space cannot tell
    if reasoning.startswith(" ") and reasoning[1:].rstrip() == wrote.rstrip():
        return True
    if reasoning.rstrip() == wrote.rstrip():
        return False
    return None


def observe(
    index: int,
    request: dict[str, Any],
    response: dict[str, Any],
    *,
    rules: ProbeRules,
    fmt: ChatFormat | None = None,
    latency_s: float = 0.0,
    http_status: int | None = 200,
) -> Observation:
    """Everything one answered probe request tells (token counts only with a format, which
    brings the tokenizer)."""
    try:
        completion = normalize_response(response)
    except ResponseError as exc:
        return Observation(index=index, ok=False, http_status=http_status,
                           error=f"invalid_response: {exc}", latency_s=latency_s)
    finding = classify_calls(completion, rules)
    id_form, id_example = id_form_of(finding.calls, rules)
    requested = thinking_from_request(request, rules.thinking_switch)
    raw_messages = request.get("messages")
    messages = raw_messages if isinstance(raw_messages, list) else []
    obs = Observation(
        index=index,
        ok=True,
        thinking=requested,
        content_kind=content_kind_of(_before_calls(completion.content, finding, rules),
                                     rules.placeholder),
        history_tool_calls=rules.history_tool_calls(messages),
        returned_indices=[rules.id_index(c.id) for c in finding.calls],
        think_end_in_content=bool(completion.content
                                  and rules.reasoning_end in completion.content
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
    reference = server_completion_ids(response)
    if reference is not None and fmt is not None:
        written = fmt.tok.decode(reference)
        obs.written_indices = [rules.id_index(raw_id)
                               for raw_id, _ in rules.written_calls(written)]
        obs.wrote_placeholder = wrote_placeholder(written, rules)
        start = rules.calls_start(written)
        if start is not None and requested is not False:
            obs.section_in_think = rules.reasoning_end not in written[:start]
        if finding.where == "structured":
            obs.content_as_written = content_as_written(completion.content, written, rules)
        obs.spaces_by_ids = spaces_by_ids(completion.reasoning, written, rules)
    fields = [t for t in (completion.reasoning, completion.content) if t and t.strip()]
    if fields:
        obs.leading_spaces = "all" if all(t.startswith(" ") for t in fields) else "not_all"
    if finding.where == "structured" and completion.content and completion.content.strip():
        obs.content_beside_calls = ("padded" if _has_outer_space(completion.content)
                                    else "bare")
    if finding.where == "structured":
        if reference is not None and fmt is not None:
            raw = rules.written_calls(fmt.tok.decode(reference))
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
        _count_raw(obs, completion, finding, fmt, rules, streamed=request.get("stream") is True)
    if request.get("logprobs"):
        obs.logprobs_coverage, obs.logprobs_why = logprobs_coverage(completion, fmt)
    return obs


def logprobs_coverage(completion: Completion, fmt: ChatFormat | None
                      ) -> tuple[Literal["all", "partial", "none"] | None, str | None]:
    """Whether the answer's logprobs name every generated token (read with the format's
    tokenizer: None without one)."""
    if not completion.logprobs:
        return "none", "no logprobs came back"
    if fmt is None:
        return None, "no tokenizer to read them with"
    named = ids_from_logprobs(completion.logprobs, fmt.tok,
                              _count(completion.usage.get("completion_tokens")))
    return ("all", None) if named.ids is not None else ("partial", named.why)


def _before_calls(content: str | None, finding: CallsFinding, rules: ProbeRules) -> str | None:
    # Raw markers left in content: the content the model wrote is what precedes them.
    if finding.where != "raw_content" or not content:
        return content
    raw = rules.raw_calls(content, truncated=True)
    return content[: raw.start] if raw is not None and raw.parsed else content


def content_kind_of(content: str | None, placeholder: str | None = None) -> ContentKind:
    if content is None:
        return "none"
    if not content.strip():
        return "empty"
    return "placeholder" if placeholder and content.strip() == placeholder else "text"


def wrote_placeholder(text: str, rules: ProbeRules) -> bool | None:
    """From the model's own text: whether it wrote the format's placeholder before its tool
    calls; None when it wrote no calls, or the format knows no placeholder (nothing a parser
    could delete then)."""
    start = rules.calls_start(text)
    if start is None or not rules.placeholder:
        return None
    before = text[:start]
    end = rules.reasoning_end
    cut = before.rfind(end)
    return before[cut + len(end) if cut != -1 else 0 :].strip() == rules.placeholder


def content_as_written(returned: str | None, text: str, rules: ProbeRules) -> bool | None:
    """From the model's own text: whether the content returned beside its calls is the text it
    wrote before them (True) or that text stripped (False); None when the model wrote no
    whitespace at either end of a non-blank text there (both readings are the same), no
    calls, or the content is neither."""
    start = rules.calls_start(text)
    if start is None or returned is None:
        return None
    before = text[:start]
    end = rules.reasoning_end
    cut = before.rfind(end)
    written = before[cut + len(end) if cut != -1 else 0 :]
    if not written.strip() or not _has_outer_space(written):
        return None
    if returned == written:
        return True
    return False if returned == written.strip() else None


def _despaced_offset(obs: Observation, completion: Completion, fmt: ChatFormat,
                     rules: ProbeRules, reported: int, *, thinking: bool,
                     truncated: bool, streamed: bool) -> int | None:
    """The raw offset of the fields without the spaces a server may have put around added
    tokens: where they all begin with one and the format says how to take them out."""
    despace = getattr(rules, "without_inserted_spaces", None)
    if despace is None or obs.leading_spaces != "all":
        return None
    despaced = despace(completion, thinking=thinking, streamed=streamed)
    if despaced is None:
        return None
    try:
        assembled = rules.assemble_as_returned(fmt, despaced, thinking=thinking,
                                               truncated=truncated,
                                               history=obs.history_tool_calls)
    except (FormatError, KeyError, TypeError, AttributeError):
        return None
    return reported - len(assembled.ids)


def _count_raw(
    obs: Observation,
    completion: Completion,
    finding: CallsFinding,
    fmt: ChatFormat,
    rules: ProbeRules,
    *,
    streamed: bool,
) -> None:
    """usage minus the returned fields assembled exactly as returned, and whether that answer
    is a clean base for counting. Deliberately not `reconstruct`: the probe must see the
    provider's behaviour, not reconstruction's corrections of it."""
    if rules.placeholder:
        obs.placeholder_tokens = len(fmt.tok.encode_ordinary(rules.placeholder))
    reported = _count(completion.usage.get("completion_tokens"))
    thinking = obs.thinking is not False  # the server default is on
    truncated = completion.finish_reason == "length"
    try:
        assembled = rules.assemble_as_returned(fmt, completion, thinking=thinking,
                                               truncated=truncated,
                                               history=obs.history_tool_calls)
    except (FormatError, KeyError, TypeError, AttributeError):
        return
    if reported is not None:
        obs.raw_completion_offset = reported - len(assembled.ids)
        obs.despaced_completion_offset = _despaced_offset(
            obs, completion, fmt, rules, reported, thinking=thinking, truncated=truncated,
            streamed=streamed)
    reasoned = bool(completion.reasoning)
    restored_flag = getattr(rules, "restored_separators_flag", None)
    if (restored_flag and obs.content_beside_calls == "bare"
            and obs.raw_completion_offset is not None
            and not truncated and reasoned == thinking and not obs.think_end_in_content
            and obs.prompt_offset in (0, None) and obs.reference_match in (None, "exact")):
        # The format's assembly either restored its separators around this content (its flag
        # says so) or used it as returned: the provider's count then says which one the model
        # wrote (the vote of the family trait that reads it).
        obs.bare_content_offset = obs.raw_completion_offset
        obs.bare_content_restored = restored_flag in assembled.flags
    obs.countable = (
        reported is not None
        and not truncated
        and finding.where in ("structured", "raw_content", "none")
        and (finding.where != "raw_content" or bool(finding.raw_section_parsed))
        and reasoned == thinking  # reasoning dropped, unsplit or forced: not the model's shape
        and not rules.uncountable_flags.intersection(assembled.flags)
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


def _count_tokens(
    obs: Observation,
    request: dict[str, Any],
    response: dict[str, Any],
    fmt: ChatFormat,
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
    canonical = next((o for o in answered if o.id_form not in ("other", "none", None)), None)
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
    # server default is thinking on.
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

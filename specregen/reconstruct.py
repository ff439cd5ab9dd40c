"""Request + response (+ reference ids) -> TokenSample, with the checks that decide trust.

A sample is `ok` only when nothing says its ids could differ from what the model saw and wrote;
anything the API cannot tell us (dropped reasoning, deleted markers, rewritten tool ids, counts
far from `usage`) makes it `flagged`. A response that cannot be read at all is an `error`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from specregen.models.kimi_k25 import IM_END, FormatError, KimiK25, count_history_tool_calls
from specregen.models.kimi_k25 import looks_stripped as _looks_stripped
from specregen.normalize import (
    ResponseError,
    normalize_response,
    reasoning_excluded,
    thinking_from_request,
)
from specregen.records import Completion, ReferenceMatch, TokenSample

# Flags that mean the ids cannot be trusted. The others are facts worth keeping (a truncated
# sample is exactly what the model wrote, cut short).
TRUST_BREAKING_FLAGS = frozenset(
    {
        "reasoning_missing",
        "thinking_mode_mismatch",
        "markers_in_text",
        "markers_stripped",
        "tool_id_rewritten",
        "tool_id_name_mismatch",
        "tool_calls_in_reasoning",
        "finish_reason_mismatch",
        "content_filter",
        "prompt_count_mismatch",
        "completion_count_mismatch",
        "reference_text_diff",
        "reference_special_diff",
    }
)


@dataclass(frozen=True)
class ReconstructConfig:
    """Tolerances between our token counts and the provider's `usage`."""

    # The prompt is deterministic: any difference means the server rendered another template.
    prompt_tolerance: int = 0
    # Sampled ids may split text non-canonically, and engines differ on counting the stop token.
    completion_tolerance_abs: int = 4
    completion_tolerance_rel: float = 0.02


def reconstruct(
    sample_id: str,
    request: dict[str, Any],
    response: dict[str, Any],
    fmt: KimiK25,
    *,
    reference_completion_ids: Sequence[int] | None = None,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
) -> TokenSample:
    """Rebuild the token ids of one sample, or say precisely why not."""
    config = config or ReconstructConfig()
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list) or not messages:
        return TokenSample.failed(sample_id, "request has no 'messages' list")
    tools = request.get("tools") or None
    try:
        completion = normalize_response(response)
    except ResponseError as exc:
        return TokenSample.failed(sample_id, str(exc))
    if completion.finish_reason == "error":
        return TokenSample.failed(sample_id, "finish_reason is 'error': the generation failed")

    flags: list[str] = []
    thinking = _thinking_mode(request, completion, default_thinking, flags)
    truncated = completion.finish_reason == "length"
    if truncated:
        flags.append("truncated")
    try:
        prompt_ids = fmt.encode_prompt(messages, tools, thinking=thinking)
        assembled = fmt.assemble(
            completion.reasoning if thinking else None,
            completion.content,
            completion.tool_calls,
            thinking=thinking,
            truncated=truncated,
            first_tool_index=count_history_tool_calls(messages),
        )
    except (FormatError, KeyError, TypeError, AttributeError) as exc:
        return TokenSample.failed(sample_id, f"cannot render the request: {exc}")
    flags.extend(assembled.flags)
    _check_finish_reason(completion, bool(assembled.tool_calls), flags)
    if not assembled.tool_calls and (
        _looks_stripped(assembled.content)
        or (completion.finish_reason == "tool_calls" and _looks_stripped(assembled.reasoning))
    ):
        flags.append("markers_stripped")

    completion_ids = assembled.ids
    prompt_delta = _usage_delta(len(prompt_ids), completion.usage.get("prompt_tokens"))
    completion_delta = _usage_delta(len(completion_ids), completion.usage.get("completion_tokens"))
    if prompt_delta is not None and abs(prompt_delta) > config.prompt_tolerance:
        flags.append("prompt_count_mismatch")
    if completion_delta is not None:
        reported = completion.usage["completion_tokens"]
        allowed = max(config.completion_tolerance_abs, config.completion_tolerance_rel * reported)
        if abs(completion_delta) > allowed:
            flags.append("completion_count_mismatch")

    match: ReferenceMatch | None = None
    if reference_completion_ids is not None:
        match = classify_reference(completion_ids, list(reference_completion_ids), fmt)
        if match in ("text_diff", "special_diff"):
            flags.append(f"reference_{match}")

    status = "flagged" if TRUST_BREAKING_FLAGS.intersection(flags) else "ok"
    return TokenSample(
        sample_id=sample_id,
        input_ids=prompt_ids + completion_ids,
        loss_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
        prompt_len=len(prompt_ids),
        completion_len=len(completion_ids),
        status=status,
        flags=flags,
        usage_prompt_delta=prompt_delta,
        usage_completion_delta=completion_delta,
        reference_match=match,
        thinking=thinking,
        reasoning=assembled.reasoning,
        content=assembled.content,
        tool_calls=assembled.tool_calls,
        api_tool_calls=assembled.api_tool_calls,
        finish_reason=completion.finish_reason,
        messages=messages,
        tools=tools,
        tool_mode="tools" if tools else "system_prompt",
    )


def _thinking_mode(
    request: dict[str, Any], completion: Completion, default: bool, flags: list[str]
) -> bool:
    requested = thinking_from_request(request)
    thinking = default if requested is None else requested
    if not thinking:
        if completion.reasoning:
            # The server reasoned although asked not to: the prompt it rendered ended in
            # `<think>`, not `<think></think>`, and the ids must follow what it did.
            flags.append("thinking_mode_mismatch")
            return True
        return False
    if not completion.reasoning:
        details = completion.usage.get("completion_tokens_details") or {}
        reasoning_tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
        # An empty reasoning is real only when the provider says no reasoning tokens were spent.
        said_empty = completion.reasoning == "" and reasoning_tokens == 0
        if reasoning_excluded(request) or not said_empty:
            flags.append("reasoning_missing")
    return True


def _check_finish_reason(completion: Completion, has_calls: bool, flags: list[str]) -> None:
    reason = completion.finish_reason
    if reason == "tool_calls" and not has_calls:
        flags.append("finish_reason_mismatch")
    elif reason == "content_filter":
        flags.append("content_filter")


def _usage_delta(ours: int, reported: Any) -> int | None:
    if isinstance(reported, bool) or not isinstance(reported, int):
        return None
    return ours - reported


def classify_reference(ours: list[int], reference: list[int], fmt: KimiK25) -> ReferenceMatch:
    """How our ids relate to the ids the server says the model generated."""
    im_end = fmt.ids[IM_END]
    # Servers differ on whether the stop token is part of the returned ids.
    if ours[-1:] == [im_end]:
        ours = ours[:-1]
    if reference[-1:] == [im_end]:
        reference = reference[:-1]
    if ours == reference:
        return "exact"
    tok = fmt.tok
    ours_special = [(i, t) for i, t in enumerate(ours) if tok.is_added(t)]
    ref_special = [(i, t) for i, t in enumerate(reference) if tok.is_added(t)]
    if [t for _, t in ours_special] != [t for _, t in ref_special]:
        return "special_diff"
    if _text_segments(ours, ours_special, fmt) == _text_segments(reference, ref_special, fmt):
        return "benign_bpe"
    return "text_diff"


def _text_segments(ids: list[int], specials: list[tuple[int, int]], fmt: KimiK25) -> list[bytes]:
    bounds = [-1, *(i for i, _ in specials), len(ids)]
    return [fmt.tok.decode_bytes(ids[a + 1 : b]) for a, b in pairwise(bounds)]


# ---------------------------------------------------------------------------------------------
# Batch input: JSONL lines of {sample_id, request, response, reference_completion_ids?}


def reconstruct_jsonl_lines(
    lines: Iterable[str],
    fmt: KimiK25,
    *,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
) -> Iterator[TokenSample]:
    """One TokenSample per input line; a bad line becomes an `error` sample naming why."""
    records = (
        (f"line {number}", line) for number, line in enumerate(lines, start=1) if line.strip()
    )
    return reconstruct_records(
        records, fmt, default_thinking=default_thinking, config=config
    )


def reconstruct_records(
    records: Iterable[tuple[str, str | dict[str, Any]]],
    fmt: KimiK25,
    *,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
) -> Iterator[TokenSample]:
    """Samples from `(where, record)` pairs; a record is a JSON line or an already decoded dict
    with `sample_id`, `request`, `response` and optional `reference_completion_ids`."""
    for where, raw in records:
        record = raw
        if isinstance(raw, str):
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                yield TokenSample.failed(_ref(where), f"{where} is not JSON: {exc}")
                continue
        if not isinstance(record, dict):
            yield TokenSample.failed(_ref(where), f"{where} is not a JSON object")
            continue
        sample_id = record.get("sample_id")
        if not isinstance(sample_id, str) or not sample_id:
            yield TokenSample.failed(_ref(where), f"{where} has no string 'sample_id'")
            continue
        missing = [k for k in ("request", "response") if not isinstance(record.get(k), dict)]
        if missing:
            yield TokenSample.failed(
                sample_id, f"{where}: missing or not an object: " + ", ".join(missing)
            )
            continue
        reference = record.get("reference_completion_ids")
        if reference is not None and not (
            isinstance(reference, list) and all(type(t) is int for t in reference)
        ):
            yield TokenSample.failed(
                sample_id, f"{where}: reference_completion_ids is not a list of ints"
            )
            continue
        yield reconstruct(
            sample_id,
            record["request"],
            record["response"],
            fmt,
            reference_completion_ids=reference,
            default_thinking=default_thinking,
            config=config,
        )


def _ref(where: str) -> str:
    # "line 7" -> "line:7": the sample id of an input line that has none.
    return where.replace(" ", ":", 1)


@dataclass
class ReconstructSummary:
    """Counts by status, flag and reference match, built as samples stream past."""

    total: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_flag: Counter[str] = field(default_factory=Counter)
    by_reference: Counter[str] = field(default_factory=Counter)
    completion_tokens: int = 0

    def add(self, sample: TokenSample) -> TokenSample:
        self.total += 1
        self.by_status[sample.status] += 1
        self.by_flag.update(sample.flags)
        if sample.reference_match:
            self.by_reference[sample.reference_match] += 1
        self.completion_tokens += sample.completion_len
        return sample

"""Request + response (+ reference ids) -> TokenSample, with the checks that decide trust.

A sample is `ok` only when nothing says its ids could differ from what the model saw and wrote;
anything the API cannot tell us (dropped reasoning, deleted markers, rewritten tool ids, counts
far from `usage`) makes it `flagged`. A response that cannot be read at all is an `error`.

Where a server's parsers may have lost text, every reading the response allows is built (by the
model's `ChatFormat`, specregen/models/chat_format.py) and the evidence picks one: the server's
own ids, else `usage` counts, which prove a reading only when no other reading is shorter
(docs/evidence.md). Each sample says what proves it in `evidence`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from specregen.logprobs import ids_from_logprobs
from specregen.models.chat_format import (
    ChatFormat,
    FormatError,
    Reading,
    parsers_drop_text,
    pick_prompt,
    streamed_content_after_calls,
    streams_calls_as_parsed,
)
from specregen.models.tokenizer import Tokenizer
from specregen.records import (
    Completion,
    Evidence,
    ProviderTraits,
    ReferenceMatch,
    Status,
    TokenSample,
    UsageTolerance,
)
from specregen.wire.response import ResponseError, normalize_response
from specregen.wire.token_ids import id_list, server_prompt_ids

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
        "tool_id_index_unexpected",
        "tool_calls_in_reasoning",
        "finish_reason_mismatch",
        "content_filter",
        "prompt_count_mismatch",
        "prompt_uncertain",
        "completion_count_mismatch",
        "completion_count_inexact",
        "reading_ambiguous",
        "max_tokens_reached",
        "truncated_tail_unknown",
        "reference_text_diff",
        "reference_special_diff",
        "logprobs_text_diff",
        "logprobs_special_diff",
        # A conversation sample (specregen/conversation/samples.py): an earlier answer of the
        # user turn is not in the prompt as the model wrote it (the server re-rendered it), or
        # could not be rebuilt from its own record.
        "history_rerendered",
        "history_unreconstructed",
    }
)
# Doubts a completion count equal to `usage` settles: their other reading (reasoning that was
# dropped, a `</think>` before a section left in the reasoning) is longer, and nothing a parser
# drops or a sampler splits makes the model's count smaller.
SETTLED_BY_COUNT = frozenset({"tool_calls_in_reasoning", "reasoning_missing"})
# Doubts an exactly equal count settles although their other reading is shorter: marker
# strings read as text. Spelled in plain tokens a marker is at least three pre-tokenizer chunks
# (`<|`/`<`, its name, `|>`/`>`); written as its own id it is one token, plus at most one space
# split off the text before it. So the other reading is shorter than the count, and fits it
# only if the model put a marker's id into its prose (leaving its template's shape) AND unseen
# tokens made up the difference: two coincidences against none, the rule `_two_coincidences`
# applies to rival readings (docs/evidence.md, "Readings"). The real vLLM measured it: every
# answer with marker strings in its text and an equal count was exactly rebuilt
# (bench/real_vllm.py).
SETTLED_BY_EXACT_COUNT = frozenset({"markers_in_text"})
# Readings in which the model left the shape its template shows: a tool section opened before
# `</think>`. Rare, but real (K2-Thinking is reported doing it), so such a reading that fits the
# count is taken; it is no rival to a template-shaped reading unless it fits without help.
DEVIATION_FLAGS = frozenset({"tool_calls_in_reasoning"})
# Completion-side doubts the server's own ids settle when ours match them.
SETTLED_BY_REFERENCE = SETTLED_BY_COUNT | {
    "markers_in_text",
    "markers_stripped",
    "completion_count_mismatch",
    "completion_count_inexact",
    "reading_ambiguous",
    "tool_id_rewritten",
    "tool_id_name_mismatch",
    "tool_id_index_unexpected",
}


@dataclass(frozen=True)
class ReconstructConfig:
    """How far counts may be from `usage`; built from the dataset's gate settings
    (`GateConfig.reconstruct_config()`), so the gate and reconstruction never disagree."""

    tolerance: UsageTolerance = field(default_factory=UsageTolerance)


# The defaults, built once: both are frozen, and building them per sample cost more than
# the checks that read them.
_DEFAULT_CONFIG = ReconstructConfig()
_NO_TRAITS = ProviderTraits()


def reconstruct(
    sample_id: str,
    request: dict[str, Any],
    response: dict[str, Any],
    fmt: ChatFormat,
    *,
    reference_completion_ids: Sequence[int] | None = None,
    reference_prompt_ids: Sequence[int] | None = None,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
    traits: ProviderTraits | None = None,
) -> TokenSample:
    """Rebuild the token ids of one sample, or say precisely why not.

    `reference_*_ids`: the ids the server says it used (vLLM's `return_token_ids`); the prompt
    ids are also taken from the response body's `prompt_token_ids` when it carries them.
    """
    config = config or _DEFAULT_CONFIG
    traits = traits or _NO_TRAITS
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

    requested = fmt.thinking_requested(request)
    thinking = default_thinking if requested is None else requested
    truncated = completion.finish_reason == "length"
    history = fmt.history_tool_calls(messages)
    id_flags: list[str] = []
    calls = fmt.undo_id_rewrites(completion.tool_calls, history, traits,
                                 request.get("stream") is True, id_flags)
    try:
        readings = fmt.readings(request, completion, calls, thinking, truncated, history, traits)
        prompts = {t: fmt.prompt_variants(messages, tools, t, traits, request=request)
                   for t in {r.thinking for r in readings}}
    except (FormatError, KeyError, TypeError, AttributeError) as exc:
        return TokenSample.failed(sample_id, f"cannot render the request: {exc}")

    reference = list(reference_completion_ids) if reference_completion_ids is not None else None
    usage = completion.usage
    p_tokens = _count(usage.get("prompt_tokens"))
    c_tokens = _count(usage.get("completion_tokens"))
    # Where the provider returned logprobs, their tokens are the model's ids: evidence like
    # the server's own, when they name every token (specregen/logprobs.py).
    source: Evidence = "reference"
    logprob_flags: list[str] = []
    if reference is None and completion.logprobs:
        named = ids_from_logprobs(completion.logprobs, fmt.tok, c_tokens)
        if named.ids is not None:
            reference, source = named.ids, "logprobs"
        else:
            logprob_flags.append("logprobs_undecidable")
    server_prompt = id_list(reference_prompt_ids)
    if server_prompt is None:
        server_prompt = server_prompt_ids(response)
    if server_prompt is not None:
        # The server's own prompt ids settle the rendering, and the thinking mode with it.
        fitting = [r for r in readings if server_prompt in prompts[r.thinking]]
        readings = fitting or readings
    for reading in readings:
        if server_prompt is not None:
            known = server_prompt in prompts[reading.thinking]
            reading.prompt_ids = server_prompt
            reading.prompt_flags = [] if known else ["prompt_from_reference"]
        else:
            reading.prompt_ids, reading.prompt_flags = pick_prompt(
                prompts[reading.thinking], p_tokens)
    chosen, match, settled_by_count, ambiguous = _choose(
        readings, reference, p_tokens, c_tokens, fmt, traits, truncated
    )

    flags = ["truncated"] if truncated else []
    flags += chosen.flags + id_flags + chosen.prompt_flags + logprob_flags
    streamed = request.get("stream") is True
    if (streamed and completion.tool_calls and completion.content and match is None
            and streamed_content_after_calls(fmt)
            and not _content_before_calls(completion, traits, fmt)):
        # Streamed, the tool parsers send text between the calls and after the section as
        # content too (docs/upstream-parsers.md): where the content stood is unknown, and no
        # count tells it (the same tokens in another place). Only the client's record of the
        # stream's order does: content that all came before the first call's delta was
        # written before the section -- on a server whose tool parser streams the calls as it
        # parses them (vLLM's and SGLang's do), which a probe's traits say it runs, or the
        # format says every server it is documented for does (`streams_calls_as_parsed`).
        ambiguous = True
    if truncated and completion.tool_calls and match is None:
        # Cut by `max_tokens` after its section began: a parser drops a cut call, or returns
        # one whose id is complete (SGLang streams it then, with an id it rebuilds): where the
        # model stopped after its last whole call is unknown, and no count tells.
        ambiguous = True
    limit = _count(request.get("max_tokens") or request.get("max_completion_tokens"))
    if not truncated and limit is not None and c_tokens is not None and c_tokens >= limit:
        # The count reached the limit although the finish reason says the model stopped:
        # vLLM reports `tool_calls` after a `length` stop, so the answer may be cut.
        flags.append("max_tokens_reached")
    if ambiguous:
        flags.append("reading_ambiguous")
    completion_ids = chosen.ids
    if match in ("text_diff", "special_diff"):
        flags.append(f"{source}_{match}")
    elif match == "benign_bpe" and reference is not None:
        # Same text and specials, split otherwise: the server's ids are what the model wrote.
        completion_ids = _with_stop(reference, completion_ids, fmt)
        flags.append("noncanonical_split")

    prompt_ids = chosen.prompt_ids
    tol = config.tolerance
    prompt_delta = _delta(len(prompt_ids), p_tokens)
    completion_delta = _delta(len(completion_ids), c_tokens)
    if prompt_delta is not None and abs(prompt_delta) > tol.prompt:
        flags.append("prompt_count_mismatch")
    count_exact = c_tokens is not None and _count_matches(len(chosen.ids), c_tokens, traits,
                                                          truncated)
    if completion_delta is not None and not count_exact:
        if abs(completion_delta) > tol.completion_allowed(c_tokens or 0):
            flags.append("completion_count_mismatch")
        elif _lossy(completion, chosen, streamed) or truncated or parsers_drop_text(fmt):
            # A parser on this path can drop text (trimmed whitespace, text after the tool
            # section, deleted placeholder content, the reasoning split): within the tolerance
            # is not good enough, only an equal count says nothing was lost. Nor on a cut
            # answer: its last token may be bytes of a character the server never sent.
            flags.append("completion_count_inexact")
    if truncated and match is None and _cut_inside_a_character(fmt.tok, chosen.assembled):
        flags.append("truncated_tail_unknown")

    evidence = _evidence(match, prompt_delta, completion_delta, count_exact, tol, c_tokens,
                         source)
    settled: frozenset[str] = frozenset()
    if evidence in ("reference", "logprobs"):
        settled = SETTLED_BY_REFERENCE
    elif settled_by_count:
        settled = SETTLED_BY_COUNT
        if truncated or traits.counts_stop_token is not None:
            # Exact: one token of slack (an unknown stop-token count) could be the difference.
            settled |= SETTLED_BY_EXACT_COUNT
    breaking = TRUST_BREAKING_FLAGS.intersection(flags) - settled
    status: Status = "flagged" if breaking else "ok"
    assembled = chosen.assembled
    loss_mask = [0] * len(prompt_ids)  # (`[0] * p + [1] * c` without its intermediate list)
    loss_mask += [1] * len(completion_ids)
    return TokenSample(
        sample_id=sample_id,
        input_ids=prompt_ids + completion_ids,
        loss_mask=loss_mask,
        prompt_len=len(prompt_ids),
        completion_len=len(completion_ids),
        status=status,
        flags=list(dict.fromkeys(flags)),
        usage_prompt_delta=prompt_delta,
        usage_completion_delta=completion_delta,
        reference_match=match,
        evidence=evidence,
        thinking=chosen.thinking,
        reasoning=assembled.reasoning,
        content=assembled.content,
        tool_calls=assembled.tool_calls,
        api_tool_calls=assembled.api_tool_calls,
        finish_reason=completion.finish_reason,
        messages=messages,
        tools=tools,
        tool_mode="tools" if tools else "system_prompt",
    )


# ---------------------------------------------------------------------------------------------
# Evidence


def _choose(
    readings: list[Reading],
    reference: list[int] | None,
    p_tokens: int | None,
    c_tokens: int | None,
    fmt: ChatFormat,
    traits: ProviderTraits,
    truncated: bool,
) -> tuple[Reading, ReferenceMatch | None, bool, bool]:
    """The reading the evidence singles out: (reading, reference match, settled by the count,
    ambiguous). Without evidence, the first; more than one reading left is an ambiguity."""
    if reference is not None:
        matches = [classify_reference(r.ids, reference, fmt) for r in readings]
        for wanted in ("exact", "benign_bpe"):
            if wanted in matches:
                return readings[matches.index(wanted)], wanted, False, False
        return readings[0], matches[0], False, len(readings) > 1
    if c_tokens is None:
        return readings[0], None, False, len(readings) > 1
    possible = [r for r in readings if p_tokens is None or len(r.prompt_ids) == p_tokens]
    fitting = [r for r in possible if _count_matches(len(r.ids), c_tokens, traits, truncated)]
    if not fitting:
        return readings[0], None, False, len(readings) > 1
    chosen = fitting[0]
    # Text a parser dropped unseen and non-canonical splits only ever make the model's count
    # larger than a reading's: another reading with a smaller count may be the truth plus
    # those, so an equal count proves the chosen one only when no other reading is that short.
    # (When the provider's counting of the stop token is unknown, one token more is in reach.)
    slack = 1 if traits.counts_stop_token is None and not truncated else 0
    rivals = [r for r in possible if r is not chosen and len(r.ids) - slack <= c_tokens
              and r.ids != chosen.ids and not _two_coincidences(r, chosen, c_tokens)]
    return chosen, None, not rivals, bool(rivals)


def _two_coincidences(rival: Reading, chosen: Reading, c_tokens: int) -> bool:
    """A rival that needs the model to leave its template's shape (DEVIATION_FLAGS) AND a
    parser to have dropped or a sampler split unseen tokens, against a chosen reading that
    fits the count as written: two independent rare events against none, so it does not make
    the chosen reading ambiguous (docs/evidence.md, "Readings"). One of them alone still does:
    a deviating reading that fits the count exactly is chosen, or is the ambiguity."""
    return (len(rival.ids) < c_tokens and bool(DEVIATION_FLAGS.intersection(rival.flags))
            and not DEVIATION_FLAGS.intersection(chosen.flags))


def _cut_inside_a_character(tok: Tokenizer, assembled: Any) -> bool:
    """Whether an answer cut by `max_tokens` may end in a token that holds the first bytes of
    a character: servers' detokenizers hold such bytes back and never send them, so the text
    shows the token without them and a token with them can give the same count. That needs a
    token of the vocabulary made of the text's last bytes plus an unfinished character."""
    text = assembled.content or assembled.reasoning or ""
    if not text:
        return False
    tail = text[-_TAIL_CHARS:].encode("utf-8")
    heads = _unfinished_heads(tok)
    return any(tail.endswith(head) for head in heads)


_TAIL_CHARS = 64
_HEADS: dict[int, tuple[Tokenizer, frozenset[bytes]]] = {}


def _unfinished_heads(tok: Tokenizer) -> frozenset[bytes]:
    """The non-empty bytes that come before an unfinished UTF-8 character in one token of
    `tok` (computed once per tokenizer; a token of only such bytes adds one to the count,
    which the count shows)."""
    cached = _HEADS.get(id(tok))
    if cached is not None and cached[0] is tok:
        return cached[1]
    heads: set[bytes] = set()
    for token_id in range(tok.base_vocab_size):
        try:
            data = tok.decode_bytes([token_id])
        except (KeyError, TypeError, ValueError, IndexError):
            continue  # an id the vocabulary leaves unused (a hole in a tokenizer.json)
        for at in range(len(data) - 1, max(-1, len(data) - 4), -1):
            lead = data[at]
            if lead & 0xC0 == 0x80:
                continue  # a continuation byte: look further back for the lead
            need = 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 1
            if len(data) - at < need and at > 0:
                heads.add(data[:at][-_TAIL_CHARS:])
            break
    _HEADS[id(tok)] = (tok, frozenset(heads))
    return _HEADS[id(tok)][1]


def _content_before_calls(completion: Completion, traits: ProviderTraits,
                          fmt: ChatFormat) -> bool:
    at = completion.content_at_calls
    known = traits.renumbers_tool_ids is not None or streams_calls_as_parsed(fmt)
    return known and at is not None and at[0] == len(completion.content or "")


def _count_matches(ours: int, reported: int, traits: ProviderTraits, truncated: bool) -> bool:
    """Our completion count equals `usage` under the provider's counting of the stop token."""
    if truncated:
        return ours == reported
    # vLLM and SGLang both count the `<|im_end|>` they generated (only the text drops it);
    # unknown counts as counted. Assuming so never passes a wrong reading: a provider that does
    # not count it reports one less than every reading, and nothing fits.
    counted = traits.counts_stop_token is not False
    return reported == (ours if counted else ours - 1)


def _lossy(completion: Completion, chosen: Reading, streamed: bool) -> bool:
    """A path on which a server's parser can drop text that the fields cannot show: the tool
    parsers, the reasoning split, and vLLM's content filter, which drops whitespace-only
    deltas of a stream."""
    return (bool(completion.tool_calls) or chosen.thinking or completion.reasoning is not None
            or streamed)


def _evidence(
    match: ReferenceMatch | None,
    prompt_delta: int | None,
    completion_delta: int | None,
    count_exact: bool,
    tol: UsageTolerance,
    c_tokens: int | None,
    source: Evidence = "reference",
) -> Evidence:
    if match in ("exact", "benign_bpe"):
        return source
    if completion_delta is None:
        return "none"
    prompt_ok = prompt_delta is not None and abs(prompt_delta) <= tol.prompt
    if count_exact and prompt_delta == 0:
        return "usage_exact"
    if abs(completion_delta) <= tol.completion_allowed(c_tokens or 0) and (
        prompt_ok or prompt_delta is None
    ):
        return "usage_tolerated"
    return "none"


def _with_stop(reference: list[int], ours: list[int], fmt: ChatFormat) -> list[int]:
    im_end = fmt.stop_id
    body = reference[:-1] if reference[-1:] == [im_end] else list(reference)
    return body + ([im_end] if ours[-1:] == [im_end] else [])


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _delta(ours: int, reported: int | None) -> int | None:
    return None if reported is None else ours - reported


def classify_reference(ours: list[int], reference: list[int], fmt: ChatFormat) -> ReferenceMatch:
    """How our ids relate to the ids the server says the model generated."""
    im_end = fmt.stop_id
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


def _text_segments(ids: list[int], specials: list[tuple[int, int]], fmt: ChatFormat) -> list[bytes]:
    bounds = [-1, *(i for i, _ in specials), len(ids)]
    return [fmt.tok.decode_bytes(ids[a + 1 : b]) for a, b in pairwise(bounds)]


# ---------------------------------------------------------------------------------------------
# Batch input: JSONL lines of {sample_id, request, response, reference_completion_ids?}


def reconstruct_jsonl_lines(
    lines: Iterable[str],
    fmt: ChatFormat,
    *,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
    traits: ProviderTraits | None = None,
) -> Iterator[TokenSample]:
    """One TokenSample per input line; a bad line becomes an `error` sample naming why."""
    records = (
        (f"line {number}", line) for number, line in enumerate(lines, start=1) if line.strip()
    )
    return reconstruct_records(
        records, fmt, default_thinking=default_thinking, config=config, traits=traits
    )


def reconstruct_records(
    records: Iterable[tuple[str, str | dict[str, Any]]],
    fmt: ChatFormat,
    *,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
    traits: ProviderTraits | None = None,
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
        prompt_reference = record.get("prompt_token_ids")
        bad = [name for name, ids in (("reference_completion_ids", reference),
                                      ("prompt_token_ids", prompt_reference))
               if ids is not None and not (isinstance(ids, list)
                                           and all(type(t) is int for t in ids))]
        if bad:
            yield TokenSample.failed(sample_id, f"{where}: {bad[0]} is not a list of ints")
            continue
        yield reconstruct(
            sample_id,
            record["request"],
            record["response"],
            fmt,
            reference_completion_ids=reference,
            reference_prompt_ids=prompt_reference,
            default_thinking=default_thinking,
            config=config,
            traits=traits,
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
    by_evidence: Counter[str] = field(default_factory=Counter)
    completion_tokens: int = 0

    def add(self, sample: TokenSample) -> TokenSample:
        self.total += 1
        self.by_status[sample.status] += 1
        self.by_flag.update(sample.flags)
        if sample.reference_match:
            self.by_reference[sample.reference_match] += 1
        if sample.evidence:
            self.by_evidence[sample.evidence] += 1
        self.completion_tokens += sample.completion_len
        return sample

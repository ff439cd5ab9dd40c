"""Readings of a K2.5 answer: what the model may have written, given what the parsers returned.

The servers' parsers lose text on some paths (docs/upstream-parsers.md): vLLM deletes
`(no content)`, SGLang rebuilds tool-call ids and may not split the reasoning, a tool section
opened before `</think>` can come back looking like a closed reasoning, vLLM's kimi_k25 parser
calls an instant answer reasoning, and servers render null fields and history arguments their own
way. Each such doubt becomes one more reading (or prompt variant); reconstruction lets the
evidence pick (specregen/reconstruct.py, docs/evidence.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from specregen.models.chat_format import Reading, pick_prompt  # noqa: F401 (re-exported)
from specregen.models.kimi_k25.common import (
    CANONICAL_ID,
    SECTION_BEGIN,
    SPACES_AROUND_ADDED_TOKENS,
    THINK_END,
    Assembled,
    tojson,
)
from specregen.records import Completion, ProviderTraits, ToolCall
from specregen.wire.response import reasoning_excluded

# vLLM's kimi_k2 reasoning parser deletes this placeholder from the content.
NO_CONTENT = "(no content)"
# A stripped call: the markers removed by a provider, the id and arguments left as text.
_STRIPPED_CALL = re.compile(r"functions\.[\w.\-]+:\d+\s*[{\[]")


class K25Format(Protocol):
    """What the readings use of the format (`format.KimiK25`, which imports this module): the
    completion's assembly and the prompt's encoding."""

    def assemble(self, reasoning: str | None, content: str | None,
                 tool_calls: Sequence[ToolCall], *, thinking: bool, truncated: bool,
                 first_tool_index: int = ..., think_end: bool = ..., verbatim_ids: bool = ...,
                 encoded: dict[str, list[int]] | None = ...) -> Assembled: ...

    def encode_prompts(self, candidates: Sequence[Sequence[dict[str, Any]]],
                       tools: Sequence[dict[str, Any]] | None, *,
                       thinking: bool) -> list[list[int]]: ...


def readings(
    fmt: K25Format,
    request: dict[str, Any],
    completion: Completion,
    calls: list[ToolCall],
    thinking: bool,
    truncated: bool,
    history: int,
    traits: ProviderTraits,
) -> list[Reading]:
    """Every reading the response allows, the most likely first (the one used without
    evidence). Most answers have exactly one."""
    texts: list[tuple[Completion, list[ToolCall], tuple[str, ...]]] = [(completion, calls, ())]
    inserted = spaces_inserted(request, traits)
    if inserted is not False:
        despaced = remove_inserted_spaces(completion, calls, thinking=thinking,
                                          streamed=request.get("stream") is True)
        if despaced is None and inserted:
            # The probe found the spaces, but these fields cannot carry them.
            texts = [(completion, calls, ("spaces_not_found",))]
        elif despaced is not None and inserted:
            texts = [(*despaced, ("spaces_removed",))]
        elif despaced is not None:
            # Unknown whether the server inserted them: both readings, which a count can
            # rarely tell apart (a leading space joins the next token): then it is ambiguous.
            texts = [(completion, calls, ("spaces_kept",)), (*despaced, ("spaces_removed",))]

    out: list[Reading] = []
    encoded: dict[str, list[int]] = {}  # the readings share their text: encode it once
    for text, text_calls, text_notes in texts:
        shapes = _shapes(request, text, bool(text_calls), thinking, truncated, traits)
        for think, r, c, think_end, notes in shapes:
            for variant, id_notes in _call_variants(request, text_calls, traits):
                assembled = fmt.assemble(
                    r if think else None, c, variant, thinking=think, truncated=truncated,
                    first_tool_index=history, think_end=think_end,
                    verbatim_ids=bool(id_notes), encoded=encoded,
                )
                ids = assembled.ids
                for other in out:
                    if other.thinking == think and other.ids == ids:
                        break
                else:
                    flags = [*text_notes, *notes, *id_notes, *assembled.flags,
                             *reading_flags(request, text, assembled, think)]
                    out.append(Reading(think, assembled, list(dict.fromkeys(flags))))
    return out


def _call_variants(request: dict[str, Any], calls: list[ToolCall], traits: ProviderTraits
                   ) -> list[tuple[list[ToolCall], tuple[str, ...]]]:
    variants: list[tuple[list[ToolCall], tuple[str, ...]]] = [(calls, ())]
    if traits.renumbers_tool_ids is not False and calls and _bare_ids_in_history(request):
        bare = bare_ids(calls)
        if bare is not None:
            # SGLang returns `functions.NAME:IDX` also for a model that wrote `NAME:IDX`. K2.5
            # writes what its template shows, `functions.NAME:IDX`, unless the conversation
            # shows it bare ids to copy.
            variants.append((bare, ("tool_id_prefix_restored",)))
    return variants


# ---------------------------------------------------------------------------------------------
# Spaces a server's detokenizer put around added tokens


def spaces_inserted(request: dict[str, Any], traits: ProviderTraits) -> bool | None:
    """Whether the answer's text carries spaces the server put around added tokens: not when
    the request turned them off (`spaces_between_special_tokens: false`, sent to vLLM and
    SGLang, which honour it), else what the probe found (None: unknown)."""
    if request.get("spaces_between_special_tokens") is False:
        return False
    return traits.get(SPACES_AROUND_ADDED_TOKENS)


def remove_inserted_spaces(completion: Completion, calls: list[ToolCall], *, thinking: bool,
                           streamed: bool) -> tuple[Completion, list[ToolCall]] | None:
    """The fields without the spaces a slow detokenizer adds (vLLM's default for Kimi's
    tokenizer): one before every added token and one before the first ordinary token after
    one (docs/vllm-0.32.md, section 1.2). K2.5's prompt ends in an added token (`<think>`, or
    `</think>` with thinking off), so the reasoning -- or, without it, the content -- starts
    with one; the content has one after `</think>` and one before a tool section; streamed
    arguments have one on each side (returned raw), plain ones are trimmed by every parser;
    ids are trimmed. A reasoning ends with one only on servers that do not trim it (0.32's
    kimi_k2 parser strips the reasoning's trailing whitespace, the model's included).

    None when the fields cannot have been made that way (a field that must start with a
    space does not): the server inserted none."""
    reasoning, content = completion.reasoning, completion.content
    closed = bool(content) or bool(calls) or completion.finish_reason != "length"
    if reasoning:
        # With thinking off too: the prompt then ends in `</think>`, and a reasoning field is
        # the answer a forcing parser called reasoning (or the server's own `<think>` turn).
        if not reasoning.startswith(" "):
            return None
        reasoning = reasoning[1:]
        if thinking and closed and reasoning.endswith(" "):
            reasoning = reasoning[:-1]
    if content and content.strip():
        if not content.startswith(" "):
            return None
        content = content[1:]
        if calls and content.endswith(" "):
            content = content[:-1]
    elif content and calls:
        # Blank content before the calls: the spaces around `</think>` and the section's
        # begin, with or without the model's own whitespace between them.
        content = content[1:] if content.startswith(" ") else content
        content = content[:-1] if content.endswith(" ") else content
    out_calls = calls
    if streamed and calls:
        out_calls = []
        for call in calls:
            arguments = call.arguments
            if arguments.startswith(" "):
                arguments = arguments[1:]
            if arguments.endswith(" "):
                arguments = arguments[:-1]
            out_calls.append(ToolCall(call.id, call.name, arguments))
    if reasoning == completion.reasoning and content == completion.content \
            and out_calls == calls:
        return None
    return replace(completion, reasoning=reasoning, content=content), out_calls


Shape = tuple[bool, str | None, str | None, bool, tuple[str, ...]]


def _shapes(
    request: dict[str, Any], completion: Completion, has_calls: bool, thinking: bool,
    truncated: bool, traits: ProviderTraits,
) -> list[Shape]:
    """(thinking, reasoning, content, think_end, notes) for each way the text may have been
    written; the tool calls are the same in all of them."""
    reasoning, content = completion.reasoning, completion.content
    shapes: list[Shape] = []
    if not thinking and reasoning:
        # Either the server reasoned although asked not to (the prompt it rendered ended in
        # `<think>`), or its reasoning parser called the whole answer reasoning (vLLM's
        # kimi_k25 parser forces thinking on). The prompt count tells them apart.
        shapes.append((True, reasoning, content, True, ("thinking_mode_mismatch",)))
        shapes.append((False, None, reasoning + (content or ""), True, ("reasoning_relabeled",)))
    else:
        shapes.append((thinking, reasoning if thinking else None, content, True, ()))
    for think, r, c, _, notes in list(shapes):
        if not think:
            continue
        if not r and c and THINK_END in c:
            # The reasoning parser did not split (SGLang without forced reasoning: K2.5's
            # `<think>` is in the prompt, so the answer never shows one): the model's first
            # `</think>` ends its reasoning.
            at = c.index(THINK_END)
            shapes.append((True, c[:at], c[at + len(THINK_END) :], True,
                           (*notes, "reasoning_unsplit")))
        elif not r and c and (has_calls or truncated):
            # Unsplit and never closed: all of it is reasoning, the section opened inside it.
            shapes.append((True, c, "", False, (*notes, "reasoning_unsplit")))
        section_first = (has_calls and not (c or "").strip()) or (
            (c or "").startswith(SECTION_BEGIN))
        if r and section_first and may_end_reasoning_at_tools(request, traits):
            # A tool section opened before `</think>` closes forced reasoning there (SGLang):
            # the API looks the same as when the model closed its thinking first.
            shapes.append((True, r, c, False, (*notes, "tool_calls_in_reasoning")))
    if has_calls and traits.deletes_no_content is not False:
        for think, r, c, think_end, notes in list(shapes):
            if think and think_end and not (c or "").strip() and c == content:
                # K2.5 writes this placeholder before its tool calls; vLLM's kimi_k2 reasoning
                # parser deletes it from the content and returns what is left blank as null.
                shapes.append((think, r, NO_CONTENT, True, (*notes, "no_content_restored")))
    return shapes


def _bare_ids_in_history(request: dict[str, Any]) -> bool:
    for message in request.get("messages") or ():
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str) and not CANONICAL_ID.match(call_id):
                return True
    return False


def bare_ids(calls: list[ToolCall]) -> list[ToolCall] | None:
    out = []
    for call in calls:
        match = CANONICAL_ID.match(call.id)
        if match is None:
            return None
        out.append(ToolCall(f"{match['name']}:{match['idx']}", call.name, call.arguments))
    return out


def may_end_reasoning_at_tools(request: dict[str, Any], traits: ProviderTraits) -> bool:
    """Whether a tool section opened before `</think>` can have come back as parsed calls."""
    # Ids returned as written and `(no content)` deleted: vLLM's kimi_k2 parsers, which leave
    # such a section in the reasoning text, streamed or not.
    if traits.renumbers_tool_ids is False and traits.deletes_no_content is True:
        return False
    # Streamed, vLLM's kimi_k25 parser ends the reasoning at the first tool marker whatever it
    # does otherwise; the trait describes answers that are not streamed.
    if request.get("stream") is True or traits.ends_reasoning_at_tools is None:
        return True
    return traits.ends_reasoning_at_tools


def reading_flags(
    request: dict[str, Any], completion: Completion, assembled: Assembled, thinking: bool
) -> list[str]:
    flags: list[str] = []
    if thinking and not assembled.reasoning:
        details = completion.usage.get("completion_tokens_details") or {}
        reasoning_tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
        # An empty reasoning is real only when the provider says no reasoning tokens were spent
        # (or, below, when the completion count proves it). vLLM 0.32 returns an empty
        # reasoning as null.
        said_empty = completion.reasoning in ("", None) and reasoning_tokens == 0
        if reasoning_excluded(request) or not said_empty:
            flags.append("reasoning_missing")
    reason = completion.finish_reason
    if reason == "tool_calls" and not assembled.tool_calls:
        flags.append("finish_reason_mismatch")
    elif reason == "content_filter":
        flags.append("content_filter")
    if not assembled.tool_calls and (
        looks_stripped(assembled.content)
        or (reason == "tool_calls" and looks_stripped(assembled.reasoning))
    ):
        flags.append("markers_stripped")
    return flags


def looks_stripped(text: str | None) -> bool:
    """Text that reads like a tool call whose markers a provider deleted."""
    if not text:
        return False
    return _STRIPPED_CALL.search(text) is not None


def undo_id_rewrites(
    calls: list[ToolCall], history: int, traits: ProviderTraits, streamed: bool,
    flags: list[str],
) -> list[ToolCall]:
    """The ids as the model wrote them, where a provider's rewrite is known and can be undone.

    K2.5 numbers its calls on from the conversation's earlier calls. SGLang rebuilds each id as
    `functions.{name}:{history + index}`: without streaming the index is the one the model
    wrote, so the history is counted twice and, when the probe says the provider does that, is
    taken off again; streamed, the index is the call's position plus the history: the running
    count K2.5 writes (a model that wrote another index is not seen; no count would tell).
    Unknown, an index that is not the running count cannot be told from a rewrite and is
    flagged.
    """
    if not calls or not history or (traits.renumbers_tool_ids and streamed):
        return calls
    out = []
    for k, call in enumerate(calls):
        match = CANONICAL_ID.match(call.id)
        if match is None:
            out.append(call)
            continue
        index = int(match["idx"])
        if traits.renumbers_tool_ids and index >= history:
            call = ToolCall(f"functions.{match['name']}:{index - history}", call.name,
                            call.arguments)
            if "tool_id_renumbered" not in flags:
                flags.append("tool_id_renumbered")
        elif (traits.renumbers_tool_ids is not False and index != history + k
              and "tool_id_index_unexpected" not in flags):
            flags.append("tool_id_index_unexpected")
        out.append(call)
    return out


# ---------------------------------------------------------------------------------------------
# Prompts


def prompt_variants(
    fmt: K25Format, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
    thinking: bool, traits: ProviderTraits,
) -> list[list[int]]:
    """The prompt as servers may render it, the most common first (docs/upstream-parsers.md).

    vLLM and SGLang parse history tool-call arguments and dump them again (`tojson`); a server
    that renders the client's string gives another prompt. vLLM drops null fields; SGLang dumps
    its message model, so every absent `reasoning_content`, `tool_call_id` or call id reaches
    the template as None, printed "None" by transformers 4 and dropped by transformers 5 (and
    it does not read `reasoning`). Each distinct rendering is a variant; `usage` picks one.
    A probed provider is one of the two (SGLang rebuilds tool-call ids, vLLM does not).
    """
    reserialized = reserialize_history_arguments(messages)
    dumped = reserialized if reserialized is not None else messages
    if all(isinstance(m, dict) and m.get("role") not in ("assistant", "tool")
           and "reasoning" not in m for m in dumped):
        # Nothing SGLang hands over differently: its messages equal these.
        sglang = [dumped, dumped]
    else:
        sglang = [sglang_messages(dumped, "None"), sglang_messages(dumped, "")]
    if traits.renumbers_tool_ids is True:
        candidates = sglang
    elif traits.renumbers_tool_ids is False:
        candidates = [dumped]
    else:
        candidates = [dumped, messages, *sglang]
    # Equal message lists render alike (a conversation without assistant or tool turns is the
    # same for every server): render and encode each once.
    distinct: list[list[dict[str, Any]]] = []
    for candidate in candidates:
        if candidate not in distinct:
            distinct.append(candidate)
    variants: list[list[int]] = []
    for ids in fmt.encode_prompts(distinct, tools, thinking=thinking):
        if ids not in variants:
            variants.append(ids)
    return variants


def reserialize_history_arguments(
    messages: Sequence[dict[str, Any]],
) -> list[dict[str, Any]] | None:
    """The messages as vLLM renders them: history tool-call `arguments` strings parsed and
    handed to the template as objects, which `tojson` dumps again (`", "`/`": "` separators,
    non-ASCII kept); empty arguments become `{}`. None when that changes no message, or when an
    argument string is not JSON (vLLM refuses such a request).
    """
    out: list[dict[str, Any]] = []
    changed = False
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls or not isinstance(calls, list):
            out.append(message)
            continue
        new_calls = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if not isinstance(args, str) and args is not None:
                new_calls.append(call)
                continue
            try:
                value = json.loads(args) if args else {}
            except json.JSONDecodeError:
                return None
            # The template writes a string as it is and dumps anything else.
            if (value if isinstance(value, str) else tojson(value)) != args:
                changed = True
            # A call without a function object has args None and gets here with fn None
            # (TypeError, as before): kept as it was, a typing pass changes no behaviour.
            new_calls.append({**call, "function": {**fn, "arguments": value}})  # type: ignore[dict-item]
        out.append({**message, "tool_calls": new_calls})
    return out if changed else None


def sglang_messages(messages: list[dict[str, Any]], none: str) -> list[dict[str, Any]]:
    """The messages as SGLang hands them to the template: absent or null `reasoning_content`,
    `tool_call_id` and call ids as `none` ("None" or ""), `reasoning` not read."""
    out = []
    for message in messages:
        new = {k: v for k, v in message.items() if k != "reasoning"}
        role = message.get("role")
        if role == "assistant":
            value = message.get("reasoning_content")
            new["reasoning_content"] = none if value is None else value
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                new["tool_calls"] = [
                    {**c, "id": none if c.get("id") is None else c["id"]}
                    if isinstance(c, dict) else c
                    for c in calls
                ]
        elif role == "tool":
            value = message.get("tool_call_id")
            new["tool_call_id"] = none if value is None else value
        out.append(new)
    return out

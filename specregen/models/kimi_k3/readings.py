"""What the API answer leaves open about a K3 completion, and the prompt as servers render it
(docs/kimi-k3.md §2.5, §4.5).

A reading is checked against the server it is documented for: its ids, detokenized and run
through our restatement of vLLM 0.32's kimi_k3 parsers (servers.py; plain or streamed as the
request was), must give back the fields the API returned (`consistent`). That is how a cut
answer's ending is found: the visible fields fix everything but the few structural ids after
the last visible text, and the answer's `completion_tokens` picks the one ending, among those
the parsers read back the same way, that has the right length.

What stays open, and how it is handled:

* Null content is an empty response channel (plain: also whitespace-only beside calls; the
  count tells); null reasoning with thinking on, an empty think channel.
* Non-string argument values were re-dumped by the parser: the encoder's spelling
  (`json.dumps`) is assumed (`arguments_canonical_assumed`). A string value for a key whose
  schema type is not a string may have been a typed value the parser could not load: a second
  reading carries the schema's type when the value is no JSON (JSON would have been loaded):
  same length, so the count cannot part them and the answer is ambiguous.
* Text the parsers drop (around the channels, between calls, `json` blocks, nameless calls):
  only an exact count proves none was dropped (`KimiK3.parsers_drop_text`).
* vLLM's stream sends text between the think channel's close and the response opener as
  content: a streamed content that starts with whitespace is ambiguous (plain drops that text).
* A stream whose think channel the model never closed sends everything as reasoning, markers
  included: read as the model's raw text (marker strings as the marker ids), first.
* A cut answer: the ending is found as above. Where a parser could hide text at the cut (after
  the response channel closed or a call ended, plain; any held-back marker prefix, streamed),
  a chosen ending past the visible text is ambiguous.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from specregen.models.chat_format import FormatError, Reading
from specregen.models.kimi_k3 import encoding as enc
from specregen.models.kimi_k3 import servers
from specregen.models.kimi_k3.completion import (
    Assembled,
    arguments_object,
    completion_segments,
    has_marker_text,
    parse_calls,
    raw_segments,
)
from specregen.models.kimi_k3.encoding import (
    CLOSE,
    OPEN,
    SEP,
    EncodingError,
    Segment,
    close_tag,
    open_tag,
    text,
    tools_segments,
)
from specregen.models.serverkit.stream import Parsed
from specregen.models.tokenizer import Tokenizer
from specregen.records import Completion, ToolCall
from specregen.wire.response import reasoning_excluded


class K3Format(Protocol):
    """What the readings use of the format (`format.KimiK3`, which imports this module): its
    tokenizer, marker ids and encoder revision, segment encoding and the completion's assembly."""

    tok: Tokenizer
    ids: dict[str, int]
    revision: str
    marker_ids: servers.MarkerIds

    @property
    def stop_id(self) -> int: ...

    def encode_segments(self, segments: list[Segment]) -> list[int]: ...

    def assemble(self, reasoning: str | None, content: str | None,
                 tool_calls: Sequence[ToolCall], *, thinking: bool, truncated: bool,
                 think_channel: bool = ...) -> Assembled: ...


# The structure that may follow the last visible text of a cut answer (as text, for a visible
# partial marker at the end of a field).
_AFTER_REASONING = servers.THINK_CLOSE + servers.RESPONSE_OPEN
_AFTER_CONTENT = (servers.RESPONSE_CLOSE + servers.TOOLS_OPEN + OPEN + "call",
                  servers.RESPONSE_CLOSE + servers.MESSAGE_CLOSE)
_COMPLETE_TAGS = (servers.RESPONSE_OPEN, servers.RESPONSE_CLOSE, servers.MESSAGE_CLOSE,
                  servers.TOOLS_OPEN)
# Types the schema may give a key whose value came back as a string.
_SCHEMA_TYPES = {"integer": "number", "number": "number", "boolean": "boolean",
                 "object": "object", "array": "array", "null": "null"}


Fields = tuple[str | None, str | None, tuple[tuple[str, str], ...]]


def observed(completion: Completion) -> Fields:
    """The returned fields in the form a parse is compared on (empty as null: routers send
    "" where vLLM sends null)."""
    return (completion.reasoning or None, completion.content or None,
            tuple((c.name, c.arguments) for c in completion.tool_calls))


def _fields(parsed: Parsed) -> Fields:
    return (parsed.reasoning or None, parsed.content or None,
            tuple((c.name, c.arguments) for c in parsed.calls))


# ---------------------------------------------------------------------------------------------
# Prompt


def prompt_variants(fmt: K3Format, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None, thinking: bool,
                    request: dict[str, Any] | None) -> list[list[int]]:
    """vLLM 0.32's rendering (its message handling and the request's effort, tool choice and
    response format), under the format's encoder revision, then the other one where they
    differ. The messages as sent are no variant: K3 is documented for vLLM only, and a
    rendering of them (text parts as separate segments, say) often has the same length as
    vLLM's, which would make every such prompt uncertain; another server's prompt is a count
    mismatch instead."""
    base = dict(request) if isinstance(request, dict) else {}
    base["messages"] = messages
    if tools:
        base["tools"] = tools
    else:
        base.pop("tools", None)
    try:
        options = servers.template_options(base)
        conversation = servers.server_conversation(messages)
        served_tools = servers.server_tools(tools)
    except servers.RequestError as exc:
        raise FormatError(str(exc)) from None
    options["thinking"] = thinking
    variants: list[list[int]] = []
    failures: list[str] = []
    revisions = (fmt.revision, *(r for r in enc.REVISIONS if r != fmt.revision))
    candidates = [(conversation, served_tools, r) for r in revisions]
    for conv, declared, revision in candidates:
        try:
            segments = enc.render_segments(conv, declared, revision=revision, **options)
        except EncodingError as exc:
            failures.append(str(exc))
            continue
        ids = fmt.encode_segments(segments)
        if ids not in variants:
            variants.append(ids)
    if not variants:
        raise FormatError(failures[0])
    return variants


# ---------------------------------------------------------------------------------------------
# Checking a reading against the restated parsers


def _prompt_for(fmt: K3Format, thinking: bool) -> list[int]:
    # All the stream's prompt check looks at: the generation prompt's last channel opener.
    return list(fmt.marker_ids.think_open) if thinking else []


def plain_fields(fmt: K3Format, ids: Sequence[int], request: dict[str, Any],
                 truncated: bool) -> tuple[Fields, str]:
    out = servers.decode_output(ids, fmt.tok, truncated)
    parsed = servers.parse_plain(out.text, request, truncated=truncated)
    return _fields(parsed), parsed.finish_reason


def stream_fields(fmt: K3Format, ids: Sequence[int], request: dict[str, Any],
                  thinking: bool) -> list[Fields]:
    """The fields a stream of `ids` adds up to after each step (index k: the first k+1
    ids), without a stop step: a cut answer's at every length in one pass."""
    out = servers.decode_output(ids, fmt.tok, True)
    parser = servers.StreamParser.for_request(request, fmt.marker_ids,
                                              _prompt_for(fmt, thinking))
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, str]] = []
    snapshots: list[Fields] = []
    for delta in out.deltas:
        piece = parser.step(delta.text, [delta.token_id])
        if piece is not None:
            if piece.reasoning:
                reasoning.append(piece.reasoning)
            if piece.content:
                content.append(piece.content)
            calls.extend(piece.calls)
        snapshots.append(("".join(reasoning) or None, "".join(content) or None, tuple(calls)))
    return snapshots


def consistent(fmt: K3Format, ids: Sequence[int], request: dict[str, Any], completion: Completion,
               thinking: bool, truncated: bool) -> bool:
    """Whether the restated server reads `ids` (the stop id included unless cut) back as the
    returned fields."""
    want = observed(completion)
    if request.get("stream") is True:
        out = servers.decode_output(ids, fmt.tok, truncated)
        parsed = servers.run_stream(out, request, fmt.marker_ids, _prompt_for(fmt, thinking))
        return _fields(parsed) == want
    fields, finish = plain_fields(fmt, ids, request, truncated)
    return fields == want and (not truncated or finish == completion.finish_reason)


# ---------------------------------------------------------------------------------------------
# Readings


def _objects(calls: Sequence[ToolCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, arguments_object(c.arguments) or {}) for c in calls]


def _schema_types(request: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per tool, per argument key: the K3 type its schema gives, when that is not a string."""
    out: dict[str, dict[str, str]] = {}
    for tool in request.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if not isinstance(fn, dict) or not isinstance(props, dict) \
                or not isinstance(fn.get("name"), str):
            continue
        for key, schema in props.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if isinstance(kind, str) and kind in _SCHEMA_TYPES:
                out.setdefault(fn["name"], {})[key] = _SCHEMA_TYPES[kind]
    return out


def _typed_alternative(calls: Sequence[ToolCall], request: dict[str, Any]
                       ) -> list[Segment] | None:
    """The calls with each string value whose schema type is not a string written under the
    schema's type (the value the parser could not load came back as its raw text), or None
    when no value is such."""
    types = _schema_types(request)
    changed = False
    out = open_tag("tools")
    for k, (name, args) in enumerate(_objects(calls), start=1):
        out += open_tag("call", (("tool", name), ("index", k)))
        for key, value in args.items():
            kind = enc.argument_type(value)
            if isinstance(value, str) and key in types.get(name, {}) and not _loads(value):
                kind = types[name][key]
                changed = True
            out += open_tag("argument", (("key", key), ("type", kind)))
            out += text(enc.argument_text(value)) + close_tag("argument")
        out += close_tag("call")
    return out + close_tag("tools") if changed else None


def _loads(value: str) -> bool:
    """Whether `value` is JSON: then a typed tag would have been loaded, not returned as text."""
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def upstream(request: dict[str, Any], thinking: bool) -> dict[str, Any]:
    """The request as the vLLM server behind the API parsed it: the reading's thinking in
    `chat_template_kwargs.thinking` (a router turns its own switch into it)."""
    kwargs = request.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    if kwargs.get("thinking") is thinking:
        return request
    return {**request, "chat_template_kwargs": {**kwargs, "thinking": thinking}}


def readings(fmt: K3Format, request: dict[str, Any], completion: Completion,
             calls: list[ToolCall], thinking: bool, truncated: bool) -> list[Reading]:
    request = upstream(request, thinking)
    stream = request.get("stream") is True
    # Empty is null: vLLM's stream sends `content: ""` on its role chunk, routers send ""
    # where vLLM sends null.
    reasoning = (completion.reasoning or None) if thinking else None
    content = completion.content or None
    flags: list[str] = []
    if thinking and reasoning_excluded(request):
        flags.append("reasoning_missing")
    if not thinking and completion.reasoning:
        # The server thought although the request said not to: not what the ids show.
        flags.append("thinking_mode_mismatch")
    if completion.finish_reason == "content_filter":
        flags.append("content_filter")
    if stream and thinking and content and content[0].isspace():
        # vLLM's stream sends text between the think channel's close and the response's
        # opener as content (plain drops it, and the count sees that): whitespace there
        # reads like content that starts with it.
        flags.append("reading_ambiguous")
    if has_marker_text(reasoning) or has_marker_text(content) or any(
            has_marker_text(c.arguments) for c in calls):
        flags.append("marker_strings_in_text")

    if truncated:
        return [_cut_reading(fmt, request, completion, calls, thinking, flags)]

    base = fmt.assemble(reasoning, content, calls, thinking=thinking, truncated=False)
    out: list[Reading] = []
    if (stream and thinking and content is None and not calls and reasoning
            and any(tag in reasoning for tag in _COMPLETE_TAGS)):
        # The model never closed its think channel: the stream sent all of it as reasoning,
        # the tags it wrote (as ids) included.
        ids = [*fmt.encode_segments(raw_segments(reasoning)), fmt.stop_id]
        raw_flags = ["think_channel_unclosed"]
        found = parse_calls(reasoning, truncated=False)
        raw_calls = list(found.calls) if found is not None else []
        if raw_calls:
            # The calls the model wrote, inside its unclosed think channel.
            raw_flags.append("tool_calls_in_reasoning")
        raw = Assembled(ids, None, _raw_content(reasoning), raw_calls, raw_calls, raw_flags)
        out.append(Reading(thinking, raw, [*flags, *raw.flags]))
    checked = "marker_strings_in_text" not in flags or consistent(
        fmt, base.ids, request, completion, thinking, False)
    first = Reading(thinking, base, [*flags, *base.flags,
                                     *([] if checked else ["reading_ambiguous"])])
    out.append(first)
    alternative = _typed_alternative(calls, request) if calls else None
    if alternative is not None:
        segments = completion_segments(reasoning, content, [], thinking=thinking)
        # Before the message's close: the tools channel the plain layout puts there.
        segments = segments[:-3] + alternative + segments[-3:]
        typed = Assembled([*fmt.encode_segments(segments), fmt.stop_id], base.reasoning,
                          base.content, base.tool_calls, base.api_tool_calls,
                          [*base.flags, "argument_type_guessed"])
        out.append(Reading(thinking, typed, [*flags, *typed.flags]))
    return out


def _raw_content(reasoning: str) -> str | None:
    found = servers.RESPONSE_RE.search(reasoning)
    return found["c"] if found else None


# ---------------------------------------------------------------------------------------------
# A cut answer


def _strip_partial(value: str, following: Sequence[str]) -> str | None:
    """`value` without a trailing partial marker (text that begins one of `following`), or
    None when it ends in none."""
    for at in range(max(0, len(value) - 64), len(value)):
        if value[at] != "<":
            continue
        tail = value[at:]
        if any(f.startswith(tail) for f in following):
            return value[:at]
    return None


def _cut_reading(fmt: K3Format, request: dict[str, Any], completion: Completion,
                 calls: list[ToolCall], thinking: bool, flags: list[str]) -> Reading:
    """The ending of a cut answer: every consistent prefix of the structure that follows the
    last visible text, the one `completion_tokens` counts chosen."""
    stream = request.get("stream") is True
    reasoning = (completion.reasoning or None) if thinking else None
    content = completion.content or None
    objects = _objects(calls)
    base = fmt.assemble(reasoning, content, calls, thinking=thinking, truncated=True)
    reported = completion.usage.get("completion_tokens") if completion.usage else None
    if not isinstance(reported, int) or isinstance(reported, bool):
        # Nothing to pick an ending with: the fields as they are (a cut in the last text).
        return Reading(thinking, _cut(base, base.ids), [*flags, *base.flags])

    # The last visible element, and the fields without a partial marker the cut left at the
    # end of the last text (plain shows it; the stream holds it back).
    shapes: list[tuple[str, str | None, str | None]] = []
    if calls:
        shapes.append(("calls", reasoning, content))
    elif content is not None or not thinking:
        shapes.append(("content", reasoning, content))
        stripped = _strip_partial(content, _AFTER_CONTENT) if content else None
        if stripped is not None:
            shapes.append(("content", reasoning, stripped or None))
        if thinking and content and servers.RESPONSE_OPEN.startswith(content):
            shapes.append(("reasoning", reasoning, None))  # a cut inside the response opener
    else:
        shapes.append(("reasoning", reasoning, None))
        stripped = _strip_partial(reasoning, (_AFTER_REASONING,)) if reasoning else None
        if stripped is not None:
            shapes.append(("reasoning", stripped or None, None))
    last = shapes[0][0]
    found: list[tuple[list[int], int]] = []  # (ids, where the visible part ends)
    for shape, r, c in shapes:
        for ids, visible in _endings(fmt, r, c, objects, thinking, shape):
            if len(ids) == reported and (ids, visible) not in found:
                found.append((ids, visible))
    if stream and found:
        snaps: dict[tuple[int, ...], bool] = {}
        kept = []
        for ids, visible in found:
            key = tuple(ids)
            if key not in snaps:
                fields = stream_fields(fmt, ids, request, thinking)
                snaps[key] = bool(fields) and fields[-1] == observed(completion)
            if snaps[key]:
                kept.append((ids, visible))
        found = kept
    elif found:
        found = [(ids, v) for ids, v in found
                 if consistent(fmt, ids, request, completion, thinking, True)]
    if not found:
        return Reading(thinking, _cut(base, base.ids), [*flags, *base.flags])
    ids, visible = found[0]
    extra: list[str] = []
    if len({tuple(i) for i, _ in found}) > 1:
        extra.append("reading_ambiguous")
    elif len(ids) > visible and (stream or _hides_text(fmt, ids, visible, request,
                                                         completion, thinking)):
        # Streamed, a held-back literal marker prefix of the same length reads the same;
        # plain, text after a closed channel or call may have been dropped unseen.
        extra.append("reading_ambiguous")
    elif stream and len(ids) == visible and _held_merge(fmt, reasoning, content, last):
        extra.append("reading_ambiguous")
    if len(ids) > visible:
        extra.append("cut_in_structure")
    return Reading(thinking, _cut(base, ids), [*flags, *base.flags, *extra])


def _cut(base: Assembled, ids: list[int]) -> Assembled:
    return Assembled(list(ids), base.reasoning, base.content, base.tool_calls,
                     base.api_tool_calls, list(base.flags))


def _endings(fmt: K3Format, reasoning: str | None, content: str | None,
             objects: list[tuple[str, dict[str, Any]]], thinking: bool, last: str
             ) -> list[tuple[list[int], int]]:
    """Every prefix of the canonical rest after the last visible element, as (ids, length of
    the visible part): the rest of the complete layout, and a layout whose tools channel goes
    on with one more call (its name unknown, so only up to `tool="`)."""
    head: list[Segment] = []
    if thinking:
        head += text(reasoning or "")
        if last == "reasoning":
            visible = len(fmt.encode_segments(head))
            rests = [close_tag("think") + open_tag("response")]
            return _prefixes(fmt, head, visible, rests)
        head += close_tag("think") + open_tag("response")
    head += text(content or "")
    more_call = [(OPEN, True), *text("call"), *text(" tool"), *text('="')]
    if last == "content":
        visible = len(fmt.encode_segments(head))
        rests = [close_tag("response") + close_tag("message"),
                 close_tag("response") + open_tag("tools") + more_call]
        return _prefixes(fmt, head, visible, rests)
    head += close_tag("response") + tools_segments(objects)[:-3]  # without the tools close
    visible = len(fmt.encode_segments(head))
    rests = [close_tag("tools") + close_tag("message"), more_call]
    return _prefixes(fmt, head, visible, rests)


def _prefixes(fmt: K3Format, head: list[Segment], visible: int, rests: list[list[Segment]]
              ) -> list[tuple[list[int], int]]:
    head_ids = fmt.encode_segments(head)
    out: list[tuple[list[int], int]] = [(head_ids, visible)] if len(head_ids) == visible else []
    for rest in rests:
        ids = head_ids + fmt.encode_segments(rest)
        for k in range(len(head_ids) + 1, len(ids) + 1):
            candidate = ids[:k]
            if (candidate, visible) not in out:
                out.append((candidate, visible))
    return out


def _hides_text(fmt: K3Format, ids: list[int], visible: int, request: dict[str, Any],
                completion: Completion, thinking: bool) -> bool:
    """Whether the plain parsers would drop text written after a complete close tag of the
    chosen ending (other than the think channel's, after which text shows until a response
    opener makes a rival longer): text there is a rival of the same length that reads the
    same. Tried with one ordinary token put there."""
    sep, close = fmt.ids[SEP], fmt.ids[CLOSE]
    probe = fmt.tok.encode_ordinary("q")
    for i in range(visible, len(ids)):
        if ids[i] != close or sep not in ids[i:]:
            continue
        j = ids.index(sep, i)
        if j == len(ids) - 1 or fmt.tok.decode(ids[i + 1:j]).strip() == "think":
            continue
        rival = ids[:j + 1] + probe + ids[j + 1:]
        if consistent(fmt, rival, request, completion, thinking, True):
            return True
    return False


def _held_merge(fmt: K3Format, reasoning: str | None, content: str | None, last: str) -> bool:
    """Streamed and cut in the last visible text: a held-back `<` (a marker's first
    character) could have joined the last token without changing the count."""
    value = content if last == "content" else reasoning
    if not value:
        return False
    tail = value[-32:]
    n = len(fmt.tok.encode_ordinary(tail))
    return any(len(fmt.tok.encode_ordinary(tail + h)) == n for h in ("<", "<|", "<|o", "<|c"))

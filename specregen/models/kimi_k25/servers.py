"""What vLLM's and SGLang's Kimi parsers make of a K2.5 completion: a re-statement, in our own
code, of the upstream behaviour described in docs/upstream-parsers.md (which names the upstream
files and functions each rule comes from). The emulator's legacy profiles `vllm-legacy` (vLLM's
kimi_k2 reasoning and tool parsers before the parser engine), `vllm-k25` (the kimi_k25
reasoning parser, gone from vLLM 0.32), `sglang` and `sglang-noforce` (SGLang's KimiK2Detector,
forced or not) run it (`served.py`). vLLM 0.32 (profile `vllm`) is `vllm032.py`; the
detokenizer here (`decode_output`) serves all of them.

The parsers see the completion as the server's detokenizer gives it: the stop token
`<|im_end|>` is not in the text, while `<think>`, `</think>` and the tool markers are (they are
not special tokens), so a marker the model wrote as plain text looks exactly like the real one
to every string-based rule. The streaming paths also see the token ids of each delta.

Non-streaming rules follow the upstream code line by line. The streaming rules reproduce, field
by field, what the upstream stream adds up to; where a streaming state machine has corner cases
we do not replay (literal marker text inside a tool section, for one), the doc says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
)
from specregen.models.serverkit.stream import Delta, Output
from specregen.models.tokenizer import Tokenizer

Server = Literal["vllm", "vllm-legacy", "vllm-k25", "sglang", "sglang-noforce"]
SERVERS: tuple[Server, ...] = ("vllm", "vllm-legacy", "vllm-k25", "sglang", "sglang-noforce")

NO_CONTENT = "(no content)"

# vLLM kimi_k2 tool parser: whitespace around the id and the arguments is not captured; an id
# is anything without `<` that ends in `:digits`; the arguments are the shortest run that does
# not cross another call's begin marker. DOTALL.
_VLLM_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(?P<id>[^<]+:\d+)\s*" + re.escape(ARG_BEGIN)
    + r"\s*(?P<args>(?:(?!" + re.escape(CALL_BEGIN) + r").)*?)\s*" + re.escape(CALL_END),
    re.DOTALL,
)
# SGLang KimiK2Detector: word characters and dots only in the id, arguments must be one
# `{...}` with no newline inside (no DOTALL).
_SGLANG_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(?P<id>[\w.]+:\d+)\s*" + re.escape(ARG_BEGIN)
    + r"\s*(?P<args>\{.*?\})\s*" + re.escape(CALL_END)
)
_SGLANG_STREAM_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(?P<id>[\w.]+:\d+)\s*" + re.escape(ARG_BEGIN)
    + r"\s*(?P<args>\{.*)"
)
_SGLANG_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.]+):(?P<index>\d+)$")


@dataclass(frozen=True, slots=True)
class ServerCall:
    id: str
    name: str
    arguments: str
    index: int  # the `index` the server puts on the call


@dataclass(frozen=True, slots=True)
class Parsed:
    reasoning: str | None
    content: str | None
    calls: tuple[ServerCall, ...]
    finish_reason: str
    # Streams only: for each call, how many characters of `content` the stream had sent
    # before the call's first delta (text between calls or after the section comes after
    # them). None: all content before the calls.
    content_at_calls: tuple[int, ...] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class MarkerIds:
    think_end: int
    section_begin: int
    section_end: int
    call_begin: int
    call_end: int
    stop: int

    @classmethod
    def of(cls, tok: Tokenizer) -> MarkerIds:
        return cls(tok.token_id(THINK_END), tok.token_id(SECTION_BEGIN),
                   tok.token_id(SECTION_END), tok.token_id(CALL_BEGIN), tok.token_id(CALL_END),
                   tok.token_id(IM_END))


def decode_output(ids: Sequence[int], tok: Tokenizer, truncated: bool, *, spaces: bool = False,
                  after_added: bool = True) -> Output:
    """Incremental detokenization as vLLM's detokenizer does it (`detokenize_incrementally`,
    and the fast path's `DecodeStream` alike): the tokens since the last emitted text are
    decoded together and the WHOLE step is held back while the result ends in U+FFFD (an
    incomplete UTF-8 character), not only its unfinished bytes -- so a token like
    ` \xf0\x9f\x94` (a space and the head of an emoji) sends "" and its space comes with the
    next step. The stop token is never detokenized; at a cut the held-back text is lost.

    `spaces`: vLLM's slow detokenizer with the request's `spaces_between_special_tokens`
    (default true) and a tokenizer with added tokens (K2.5's): each window is decoded piece by
    piece, every added token a piece of its own, joined with " ". Step by step that puts a
    space before every added token and before the first ordinary token after one, held text
    included; `after_added`: the prompt ends in an added token (K2.5's ends in `<think>` or
    `</think>`), so the answer's first token gets one too (docs/vllm-0.32.md, 1.2)."""
    stop = tok.token_id(IM_END)
    deltas: list[Delta] = []
    pending = b""
    # The pending run of ordinary tokens follows an added token (a space goes before it).
    run_after_added = after_added
    for token_id in ids:
        if token_id == stop:
            break
        if spaces and vllm_added(tok, token_id):
            text = ""
            if pending:  # an unfinished character is flushed as U+FFFD by the added token
                text = (" " if run_after_added else "") + pending.decode("utf-8", "replace")
            deltas.append(Delta(text + " " + tok.decode([token_id]), token_id))
            pending, run_after_added = b"", True
            continue
        pending += tok.decode_bytes([token_id])
        text = pending.decode("utf-8", errors="replace")
        if text.endswith("\ufffd"):
            deltas.append(Delta("", token_id))
            continue
        if spaces and run_after_added:
            text = " " + text
            run_after_added = False
        deltas.append(Delta(text, token_id))
        pending = b""
    return Output("".join(d.text for d in deltas), tuple(deltas), truncated)


def vllm_added(tok: Tokenizer, token_id: int) -> bool:
    """An added token to vLLM's slow detokenizer: one named in the tokenizer config's
    `added_tokens_decoder` (K2.5: the markers and the special tokens; the reserved ids the
    config does not name are ordinary tokens to it)."""
    name = tok.added_name(token_id)
    return name is not None and not name.startswith("<|reserved_token_")


def request_thinking(request: dict[str, Any]) -> bool:
    """Thinking as vLLM/SGLang read it: `chat_template_kwargs.thinking`, default on."""
    kwargs = request.get("chat_template_kwargs")
    return not (isinstance(kwargs, dict) and kwargs.get("thinking") is False)


def parses_tools(request: dict[str, Any]) -> bool:
    """Both servers parse calls only when the request sent `tools` and did not say "none".
    vLLM sends `required` and named choices down a JSON path that K2.5's native output does
    not fit; the emulator treats them as auto (docs/upstream-parsers.md)."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def history_tool_calls(messages: Sequence[dict[str, Any]]) -> int:
    """Tool calls on every assistant message of the request (SGLang and vLLM count alike)."""
    count = 0
    for message in messages:
        if message.get("role") == "assistant" and isinstance(message.get("tool_calls"), list):
            count += len(message["tool_calls"])
    return count


def parse(server: Server, out: Output, request: dict[str, Any], ids: MarkerIds,
          *, stream: bool) -> Parsed:
    if server == "vllm":
        raise ValueError("vLLM 0.32 (`vllm`) is vllm032.py's; this module restates the legacy "
                         "parsers and SGLang")
    if server in ("vllm-legacy", "vllm-k25"):
        if stream:
            return _vllm_stream(server, out, request, ids)
        return _vllm_plain(server, out, request)
    if stream:
        return _sglang_stream(server, out, request)
    return _sglang_plain(server, out, request)


# ---------------------------------------------------------------------------------------------
# vLLM


def _r1_split(text: str) -> tuple[str, str | None]:
    # DeepSeek-R1's split: drop up to the first `<think>`; no `</think>` means all reasoning.
    before, found, after = text.partition(THINK)
    text = after if found else before
    if THINK_END not in text:
        return text, None
    reasoning, _, content = text.partition(THINK_END)
    return reasoning, content or None


def _clean_no_content(content: str | None) -> str | None:
    # kimi_k2 reasoning parser's content filter, applied to the whole content string.
    if content is None:
        return None
    cleaned = content.replace(NO_CONTENT, "")
    return cleaned if cleaned.strip() else None


def _vllm_calls(section_text: str) -> tuple[ServerCall, ...]:
    calls = []
    for i, match in enumerate(_VLLM_CALL.finditer(section_text)):
        call_id = match.group("id")
        name = call_id.split(":")[0].split(".")[-1]
        calls.append(ServerCall(call_id, name, match.group("args"), i))
    return tuple(calls)


def _vllm_plain(server: Server, out: Output, request: dict[str, Any]) -> Parsed:
    text = out.text
    if server == "vllm-k25" or request_thinking(request):
        reasoning, content = _r1_split(text)
    else:
        reasoning, content = None, text
    if server == "vllm-legacy":
        content = _clean_no_content(content)
    engine_finish = "length" if out.truncated else "stop"
    if parses_tools(request) and content is not None and SECTION_BEGIN in content:
        calls = _vllm_calls(content)
        before = content[: content.find(SECTION_BEGIN)]
        # The parser reports `tools_called` as soon as the marker is there, so the content is
        # cut even when no call matched; the serving layer drops whitespace-only content and
        # says `tool_calls` only when calls came back (also after a `length` stop).
        content = before if before.strip() else None
        return Parsed(reasoning, content, calls, "tool_calls" if calls else engine_finish)
    return Parsed(reasoning, content, (), engine_finish)


def _vllm_stream(server: Server, out: Output, request: dict[str, Any], ids: MarkerIds) -> Parsed:
    tools = parses_tools(request)
    thinking = server == "vllm-k25" or request_thinking(request)
    reasoning: list[str] = []
    content: list[str] = []
    saw_reasoning = False
    ended = not thinking  # the identity parser has "ended" reasoning before the first token
    tool_phase: list[Delta] = []
    seen_end = False
    for delta in out.deltas:
        if tools and ended:
            tool_phase.append(delta)
            continue
        r_text: str | None = None
        c_text: str | None = None
        if not thinking:
            c_text = delta.text
        elif server == "vllm-k25" and not seen_end and delta.token_id in (
                ids.section_begin, ids.call_begin):
            # kimi_k25: a tool marker before `</think>` turns the rest into content.
            ended = True
            if tools:
                tool_phase.append(delta)
                continue
            c_text = delta.text
        elif ended and not tools:
            c_text = delta.text
        elif delta.token_id == ids.think_end:
            seen_end = ended = True  # a lone `</think>` step is swallowed
            continue
        else:
            r_text = delta.text
        if server == "vllm-legacy" and c_text is not None:
            # The content filter runs per delta: whitespace-only steps vanish, and the
            # placeholder only goes when one step holds all of it.
            c_text = _clean_no_content(c_text)
        if r_text is not None:
            reasoning.append(r_text)
            saw_reasoning = True
        if c_text is not None:
            content.append(c_text)
    calls: tuple[ServerCall, ...] = ()
    at: tuple[int, ...] | None = None
    if tool_phase:
        before = sum(len(c) for c in content)
        text_parts, calls, positions = _vllm_stream_tools(tool_phase, ids)
        content.extend(text_parts)
        at = tuple(before + p for p in positions) if calls else None
    # The stream says tool_calls only after a natural stop (a `length` stop stays `length`).
    finish = "length" if out.truncated else "tool_calls" if calls else "stop"
    return Parsed(
        "".join(reasoning) if saw_reasoning else None,
        "".join(content) if content else None,
        calls,
        finish,
        at,
    )


def _vllm_stream_tools(deltas: Sequence[Delta], ids: MarkerIds
                       ) -> tuple[list[str], tuple[ServerCall, ...], tuple[int, ...]]:
    """The kimi_k2 tool parser's stream: text before the section and after it (and between
    calls) goes out as content; the run between the section begin and the first call is
    suppressed; each call is the regex's id and trimmed arguments. Also, per call, the
    characters of content sent before it."""
    content: list[str] = []
    calls: list[ServerCall] = []
    positions: list[int] = []
    state = "text"  # text -> preamble -> call -> between -> text (after the section end)
    call_text: list[str] = []
    for delta in deltas:
        tid = delta.token_id
        if state == "text":
            if tid == ids.section_begin:
                state = "preamble"
            else:
                content.append(delta.text)
        elif state in ("preamble", "between"):
            if tid == ids.call_begin:
                state, call_text = "call", [delta.text]
            elif tid == ids.section_end:
                state = "text"
            elif state == "between":
                content.append(delta.text)
        else:  # inside a call
            call_text.append(delta.text)
            if tid == ids.call_end:
                found = _vllm_calls("".join(call_text))
                if found:
                    c = found[0]
                    calls.append(ServerCall(c.id, c.name, c.arguments, len(calls)))
                    positions.append(sum(len(t) for t in content))
                state = "between"
    return [c for c in content if c], tuple(calls), tuple(positions)


# ---------------------------------------------------------------------------------------------
# SGLang


def _sglang_forced(server: Server, request: dict[str, Any]) -> bool:
    # Newest serving code forces the Kimi detector unless the request turned thinking off;
    # older servers never force it.
    return server == "sglang" and request_thinking(request)


def _sglang_reasoning_split(text: str, forced: bool) -> tuple[str, str]:
    if not (forced or THINK in text):
        return "", text
    while text.startswith(THINK):
        text = text[len(THINK):]
    end = text.find(THINK_END)
    section = text.find(SECTION_BEGIN)
    if end == -1:
        if section != -1:
            return text[:section], text[section:]
        return text, ""
    return text[:end], text[end + len(THINK_END):]


def _sglang_plain(server: Server, out: Output, request: dict[str, Any]) -> Parsed:
    reasoning, text = _sglang_reasoning_split(out.text, _sglang_forced(server, request))
    finish = "length" if out.truncated else "stop"
    calls: list[ServerCall] = []
    if parses_tools(request) and SECTION_BEGIN in text:
        if finish == "stop":
            finish = "tool_calls"
        history = history_tool_calls(request["messages"])
        for match in _SGLANG_CALL.finditer(text):
            id_match = _SGLANG_ID.match(match.group("id"))
            if id_match is None:
                continue
            name, index = id_match.group("name"), int(id_match.group("index"))
            # The id is rebuilt from the index the model wrote plus the request's history.
            calls.append(ServerCall(f"functions.{name}:{history + index}", name,
                                    match.group("args"), index))
        text = text[: text.find(SECTION_BEGIN)]
    return Parsed(reasoning or None, text, tuple(calls), finish)


def _sglang_stream(server: Server, out: Output, request: dict[str, Any]) -> Parsed:
    reasoning, chunks = _sglang_stream_reasoning([d.text for d in out.deltas],
                                                 _sglang_forced(server, request))
    finish = "length" if out.truncated else "stop"
    if not parses_tools(request):
        return Parsed(reasoning, "".join(chunks), (), finish)
    content, calls, at = _sglang_stream_tools(chunks, history_tool_calls(request["messages"]))
    if calls and finish == "stop":
        finish = "tool_calls"
    return Parsed(reasoning, content, calls, finish, at if calls else None)


def _sglang_stream_reasoning(steps: Sequence[str], forced: bool
                             ) -> tuple[str | None, list[str]]:
    """BaseReasoningFormatDetector's streaming increment, step by step: the reasoning text and
    the normal-text pieces handed on to the tool detector.

    Unlike the one-shot split, the stream strips the first `<think>` string it meets wherever
    it is (a literal one in the answer switches reasoning back on), and a text that is a
    prefix of a marker is held back until it is not.
    """
    reasoning: list[str] = []
    normal: list[str] = []
    buffer = ""
    in_reasoning = forced
    stripped = False
    for step in steps:
        buffer += step
        text = buffer
        if any(m.startswith(text) and m != text for m in (THINK, THINK_END, SECTION_BEGIN)):
            continue
        if not stripped and THINK in text:
            text = text.replace(THINK, "", 1)
            stripped = in_reasoning = True
        buffer = ""
        if in_reasoning and THINK_END in text:
            cut = text.index(THINK_END)
            reasoning.append(text[:cut])
            normal.append(text[cut + len(THINK_END):])
            in_reasoning = False
        elif in_reasoning and SECTION_BEGIN in text:
            cut = text.index(SECTION_BEGIN)
            reasoning.append(text[:cut])
            normal.append(text[cut:])
            in_reasoning = False
        elif in_reasoning:
            reasoning.append(text)
        else:
            normal.append(text)
    # A held-back prefix at the very end is never sent.
    joined = "".join(reasoning)
    return joined or None, normal


def _sglang_stream_tools(chunks: Sequence[str], history: int
                         ) -> tuple[str, tuple[ServerCall, ...], tuple[int, ...]]:
    """KimiK2Detector.parse_streaming_increment, step by step, then the serving layer's
    end-of-stream top-up of the last call's arguments. Also, per call, the characters of
    content sent before it opened."""
    content: list[str] = []
    positions: list[int] = []
    names: list[str] = []
    args: list[str] = []
    parsed_args: list[Any] = []
    buffer = ""
    name_sent = False
    seen = ""  # the arguments text already accounted for in the open call
    for chunk in chunks:
        buffer += chunk
        if SECTION_BEGIN not in buffer and CALL_BEGIN not in buffer:
            buffer = ""
            content.append(_drop_end_markers(chunk))
            continue
        match = _SGLANG_STREAM_CALL.search(buffer)
        if match is None:
            continue
        id_match = _SGLANG_ID.match(match.group("id"))
        if id_match is None:
            continue
        if not name_sent:
            # The step that completes the id opens the call; its arguments wait a step.
            names.append(id_match.group("name"))
            positions.append(sum(len(t) for t in content))
            args.append("")
            parsed_args.append({})
            name_sent = True
            continue
        text = match.group("args")
        diff = text[len(seen):] if text.startswith(seen) else text
        piece = diff.split(CALL_END, 1)[0]
        if piece:
            args[-1] += piece
            seen += diff
        whole = text.split(CALL_END, 1)[0]
        try:
            parsed_args[-1] = json.loads(whole)
        except ValueError:
            continue
        # Complete: drop the finished call from the buffer and wait for the next one.
        done = re.search(re.escape(CALL_BEGIN) + ".*?" + re.escape(CALL_END), buffer, re.DOTALL)
        buffer = buffer[done.end():] if done else ""
        name_sent, seen = False, ""
    if args:
        expected = json.dumps(parsed_args[-1], ensure_ascii=False)
        if args[-1] in expected:
            args[-1] += expected.replace(args[-1], "", 1)
    calls = tuple(ServerCall(f"functions.{name}:{history + i}", name, a, i)
                  for i, (name, a) in enumerate(zip(names, args, strict=True)))
    return "".join(content), calls, tuple(positions)


def _drop_end_markers(text: str) -> str:
    return text.replace(SECTION_END, "").replace(CALL_END, "")

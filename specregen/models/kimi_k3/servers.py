"""What a vLLM 0.32 server (`--tokenizer-mode kimi_k3 --reasoning-parser kimi_k3
--tool-call-parser kimi_k3 --enable-auto-tool-choice`) makes of a Kimi K3 request and
completion: a re-statement, in our own code, of the behaviour docs/kimi-k3.md (§2.5, §4)
describes and names the upstream files of.

Request side: vLLM's message parsing (`server_conversation`), its K3 renderer's tool-result
ordering and keyword handling (`template_options`), then K3's encoder (encoding.py) -- the
prompt ids as the server renders them (`encode_prompt`).

Completion side: the parsers see the text as vLLM's detokenizer gives it. Both K3 parsers force
`skip_special_tokens=false` and `spaces_between_special_tokens=false`, so the text is the plain
decode, markers included as their strings; the stop token `<|end_of_msg|>` is not in it. Both
parsers are string-based (not parser engines): a marker the model spelled in ordinary tokens
reads like the real one, except where the stream looks at ids (the reasoning end). `parse`
gives the non-streamed answer; `StreamParser` the stream, step by step (`stream` drives it).

What the parsers see and return (`Delta`, `Output`, `ServerCall`, `Parsed`) and the stream's
hold-back (`tag_overlap`) are the server kit's (`models/serverkit/stream.py`, in K3's
fingerprint since its readings run these parsers). This module depends on nothing in
`specregen.emulator`; the emulator wires it in.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specregen.models.kimi_k3.encoding import (
    CLOSE,
    END_OF_MSG,
    OPEN,
    SEP,
    EncodingError,
    Segment,
    render_segments,
)
from specregen.models.kimi_k3.tokens import EOS, encode_segments
from specregen.models.serverkit.stream import Delta, Output, Parsed, ServerCall, tag_overlap
from specregen.models.tokenizer import Tokenizer

THINKING_EFFORTS = ("low", "high", "max")
# What vLLM's request model accepts as `reasoning_effort` (others: a 400 at validation).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


class RequestError(ValueError):
    """A request the server refuses (vLLM answers 400)."""


# ---------------------------------------------------------------------------------------------
# Request side


def template_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    kwargs = request.get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def effective_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    """The `chat_template_kwargs` the parsers and the renderer get: the request's own, plus
    `enable_thinking = (reasoning_effort != "none")` when it sets an effort and no
    `enable_thinking` (`ChatCompletionRequest.build_chat_params`)."""
    kwargs = template_kwargs(request)
    effort = request.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise RequestError(f"reasoning_effort {effort!r} is not one of "
                               f"{', '.join(REASONING_EFFORTS)}")
        if "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = effort != "none"
    return kwargs


def parser_thinking(request: dict[str, Any]) -> bool:
    """Thinking as both K3 parsers read it: `thinking`, else `enable_thinking`, else on."""
    kwargs = effective_kwargs(request)
    value = kwargs.get("thinking")
    if value is None:
        value = kwargs.get("enable_thinking", True)
    return bool(value)


def tool_choice(request: dict[str, Any]) -> Any:
    """The request's `tool_choice` after vLLM's defaults: "auto" with tools, "none" without."""
    if "tool_choice" in request:
        return request["tool_choice"]
    return "auto" if request.get("tools") else "none"


def preserves_tool_channels(request: dict[str, Any]) -> bool:
    """Whether the reasoning parser hands the text after the reasoning on raw (the tool parser
    unwraps it) rather than unwrapping the response channel itself."""
    return bool(request.get("tools")) and tool_choice(request) != "none"


def template_options(request: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments K3's encoder gets from vLLM's renderer (`KimiK3Renderer.
    _apply_chat_template`): thinking (`thinking`, else `enable_thinking`; effort "none" turns
    it off), the effort (`thinking_effort`, else a `reasoning_effort` other than "none"; an
    unsupported one is a 400, with thinking off too), `tool_choice` when the request has tools
    and says neither auto nor nothing, `response_format`."""
    kwargs = effective_kwargs(request)
    enable = kwargs.pop("enable_thinking", None)
    if enable is not None:
        kwargs.setdefault("thinking", enable)
    effort = request.get("reasoning_effort")
    if effort == "none":
        kwargs.setdefault("thinking", False)
    elif effort is not None:
        kwargs.setdefault("thinking_effort", effort)
    if kwargs.get("thinking_effort") is not None and \
            kwargs["thinking_effort"] not in THINKING_EFFORTS:
        raise RequestError(f"Kimi K3 supports thinking_effort values: "
                           f"{', '.join(THINKING_EFFORTS)}")
    thinking = kwargs.get("thinking")
    options: dict[str, Any] = {
        "thinking": True if thinking is None else bool(thinking),
        "thinking_effort": kwargs.get("thinking_effort") or "max",
        "add_generation_prompt": request.get("add_generation_prompt", True) is not False,
    }
    choice = request.get("tool_choice")
    if request.get("tools") and choice not in (None, "auto"):
        options["tool_choice"] = choice
    if isinstance(request.get("response_format"), dict):
        options["response_format"] = request["response_format"]
    return options


def server_tools(tools: Any) -> list[dict[str, Any]] | None:
    """`tools` as vLLM hands them to the encoder (`tool.model_dump()`): `type`, and `function`
    with `name`, `description`, `parameters` (null when missing), `strict` and `defer_loading`
    only when set; other keys dropped."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] has no function name")
        dumped: dict[str, Any] = {"name": fn["name"], "description": fn.get("description"),
                                  "parameters": fn.get("parameters")}
        defer = fn.get("defer_loading")
        if defer is None:
            defer = tool.get("defer_loading")
        for key, value in (("strict", fn.get("strict")), ("defer_loading", defer)):
            if value is not None:
                dumped[key] = value
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                texts.append(part.get("text") or "")
            else:
                raise RequestError(f"{where}.content[{j}]: only text parts are restated for "
                                   "Kimi K3")
        return "\n".join(texts)
    raise RequestError(f"{where}.content must be a string or a list")


def _history_arguments(arguments: Any) -> dict[str, Any]:
    """vLLM's `_postprocess_messages`: a JSON object string parsed; empty, invalid JSON and
    JSON that is not an object all become `{}` (logged, not refused)."""
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def server_conversation(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts vLLM 0.32 hands to K3's encoder (docs/kimi-k3.md §2.5): content as
    one string (text parts joined with "\\n", null as ""), `name` kept (a string), an
    assistant's `reasoning` (or `reasoning_content`) under both names, its calls with
    arguments as objects (an empty list dropped), a tool message's `tool_call_id`; every other
    key dropped. Then the renderer's own tool-result ordering (`order_results`)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] has no string role")
        role = message["role"]
        new: dict[str, Any] = {"role": role,
                               "content": _text_of(message.get("content"), f"messages[{i}]")}
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                new_calls = []
                for j, call in enumerate(calls):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(fn, dict) or call.get("type", "function") != "function":
                        raise RequestError(f"messages[{i}].tool_calls[{j}] is not a function "
                                           "call")
                    new_call = copy.deepcopy(call)
                    new_call["function"] = {**fn, "arguments": _history_arguments(
                        fn.get("arguments"))}
                    new_calls.append(new_call)
                new["tool_calls"] = new_calls
            reasoning = message.get("reasoning")
            if reasoning is None:
                reasoning = message.get("reasoning_content")
            if reasoning is not None:
                new["reasoning"] = new["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            new["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            new["name"] = message["name"]
        out.append(new)
    return order_results(out)


def order_results(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`_normalize_k3_tool_messages`: each run of tool messages after an assistant message
    with calls is matched by `tool_call_id` against the calls' ids and their aliases
    `"{name}:{zero-based position}"`; when every message of the run matches, the run is put
    in call order (stable) and each message gets `tool` (the call's name) and `index` (its
    1-based position); otherwise the run stays as sent."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(conversation):
        message = conversation[i]
        out.append(dict(message))
        i += 1
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        targets: dict[str, tuple[int, str]] = {}
        for position, call in enumerate(calls):
            fn = call.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str) or not name:
                continue
            aliases = [f"{name}:{position}"]
            if call.get("id"):
                aliases.insert(0, str(call["id"]))
            for alias in aliases:
                targets.setdefault(alias, (position, name))
        start = i
        while i < len(conversation) and conversation[i].get("role") == "tool":
            i += 1
        run = conversation[start:i]
        resolved = []
        for order, tool_message in enumerate(run):
            key = tool_message.get("tool_call_id")
            target = targets.get(str(key)) if key is not None else None
            if target is None:
                out.extend(dict(m) for m in run)
                break
            resolved.append((target[0], order, {**tool_message, "tool": target[1],
                                                "index": target[0] + 1}))
        else:
            resolved.sort(key=lambda r: (r[0], r[1]))
            out.extend(m for _, _, m in resolved)
    return out


def render_request(request: dict[str, Any], *, revision: str = "r3") -> list[Segment]:
    """The prompt segments a vLLM 0.32 K3 server renders for `request`."""
    options = template_options(request)
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    try:
        return render_segments(server_conversation(messages), server_tools(request.get("tools")),
                               revision=revision, **options)
    except EncodingError as exc:
        raise RequestError(str(exc)) from None


def encode_prompt(request: dict[str, Any], tok: Tokenizer, *, revision: str = "r3"
                  ) -> list[int]:
    return encode_segments(tok, render_request(request, revision=revision))


# ---------------------------------------------------------------------------------------------
# Completion side: detokenization


def decode_output(ids: Sequence[int], tok: Tokenizer, truncated: bool) -> Output:
    """vLLM's slow incremental detokenizer with `spaces_between_special_tokens=false`: the
    plain decode, step by step; a step whose text would end in an incomplete UTF-8 character
    sends "" and its bytes come with the step that completes it (at a cut they are lost); a
    stop token (`<|end_of_msg|>`, or the tokenizer's `[EOS]`) ends the text and is not in
    it."""
    stops = {tok.token_id(END_OF_MSG), tok.added_tokens.get(EOS, -1)}
    deltas: list[Delta] = []
    pending = b""
    stop_id = None
    for token_id in ids:
        if token_id in stops:
            stop_id = token_id
            break
        pending += tok.decode_bytes([token_id])
        text = pending.decode("utf-8", errors="replace")
        if text.endswith("\ufffd"):
            deltas.append(Delta("", token_id))
            continue
        deltas.append(Delta(text, token_id))
        pending = b""
    return Output("".join(d.text for d in deltas), tuple(deltas), truncated, stop_id)


# ---------------------------------------------------------------------------------------------
# The parsers' patterns: markers as strings, with `\s*` tolerated inside a marker's tag.

_O, _C, _S = re.escape(OPEN), re.escape(CLOSE), re.escape(SEP)


def _tag(marker_re: str, name: str) -> re.Pattern[str]:
    return re.compile(marker_re + r"\s*" + name + r"\s*" + _S)


THINK_OPEN_RE = _tag(_O, "think")
THINK_CLOSE_RE = _tag(_C, "think")
RESPONSE_OPEN_RE = _tag(_O, "response")
RESPONSE_CLOSE_RE = _tag(_C, "response")
MESSAGE_CLOSE_RE = _tag(_C, "message")
TOOLS_OPEN_RE = _tag(_O, "tools")
TOOLS_CLOSE_RE = _tag(_C, "tools")
_UNTIL_SEP = r"(?:(?!" + _S + r").)*?"
CALL_RE = re.compile(_O + r"\s*call\s+(?P<attrs>" + _UNTIL_SEP + r")" + _S + r"(?P<body>.*?)"
                     + _C + r"\s*call\s*" + _S, re.DOTALL)
ARGUMENT_RE = re.compile(_O + r"\s*argument\s+(?P<attrs>" + _UNTIL_SEP + r")" + _S
                         + r"(?P<val>.*?)" + _C + r"\s*argument\s*" + _S, re.DOTALL)
ATTR_RE = re.compile(r'(?P<k>\w+)="(?P<v>[^"]*)"')
RESPONSE_RE = re.compile(_O + r"\s*response\s*" + _S + r"(?P<c>.*?)" + _C + r"\s*response\s*"
                         + _S, re.DOTALL)

THINK_OPEN = OPEN + "think" + SEP
THINK_CLOSE = CLOSE + "think" + SEP
RESPONSE_OPEN = OPEN + "response" + SEP
RESPONSE_CLOSE = CLOSE + "response" + SEP
MESSAGE_CLOSE = CLOSE + "message" + SEP
TOOLS_OPEN = OPEN + "tools" + SEP
TOOLS_CLOSE = CLOSE + "tools" + SEP


def attributes(text: str) -> dict[str, str]:
    """`k="v"` pairs, values unescaped (`&quot;` first, then `&amp;`); the last of a key wins."""
    return {m["k"]: m["v"].replace("&quot;", '"').replace("&amp;", "&")
            for m in ATTR_RE.finditer(text)}


def decode_call(attrs: str, body: str) -> tuple[str, str] | None:
    """One call block: (name, arguments JSON), or None without a tool name. Each complete
    argument block counts: `type="string"` (or none) takes the raw text, any other type is
    `json.loads`ed, falling back to the raw text; `json.dumps` with default separators."""
    name = attributes(attrs).get("tool", "")
    arguments: dict[str, Any] = {}
    for m in ARGUMENT_RE.finditer(body):
        attrs_of = attributes(m["attrs"])
        key = attrs_of.get("key", "")
        raw = m["val"]
        if attrs_of.get("type", "string") == "string":
            arguments[key] = raw
        else:
            try:
                arguments[key] = json.loads(raw)
            except json.JSONDecodeError:
                arguments[key] = raw
    if not name:
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def section_calls(section: str) -> list[tuple[str, str]]:
    return [c for m in CALL_RE.finditer(section) if (c := decode_call(m["attrs"], m["body"]))]


def _strip_response(text: str) -> str | None:
    """The tool parser's `_strip_response_content`."""
    m_open = RESPONSE_OPEN_RE.search(text)
    if m_open is not None:
        m_close = RESPONSE_CLOSE_RE.search(text, m_open.end())
        text = text[m_open.end():m_close.start()] if m_close else text[m_open.end():]
    else:
        text = RESPONSE_CLOSE_RE.sub("", text)
    return MESSAGE_CLOSE_RE.sub("", text) or None


def _strip_wrapper(text: str) -> str:
    """The reasoning parser's `_strip_content_wrapper`."""
    m_open = RESPONSE_OPEN_RE.search(text)
    m_close = RESPONSE_CLOSE_RE.search(text, m_open.end() if m_open else 0)
    if m_open is not None and m_close is not None:
        text = text[m_open.end():m_close.start()]
    elif m_open is not None:
        text = text[m_open.end():]
    else:
        text = RESPONSE_CLOSE_RE.sub("", RESPONSE_OPEN_RE.sub("", text))
    return MESSAGE_CLOSE_RE.sub("", text)


def extract_tools(text: str) -> tuple[bool, list[tuple[str, str]], str | None]:
    """`KimiK3ToolParser.extract_tool_calls`: (called, calls, content). Calls are the complete
    call blocks between the first tools-open and the tools-close after it (or the end); the
    content is the body of the first complete response channel anywhere in the text, else
    the text before the tools-open without its response markers."""
    m_open = TOOLS_OPEN_RE.search(text)
    if m_open is None:
        return False, [], _content(text, text)
    before = text[:m_open.start()]
    m_close = TOOLS_CLOSE_RE.search(text, m_open.end())
    section = text[m_open.end():m_close.start() if m_close else len(text)]
    calls = section_calls(section)
    return bool(calls), calls, _content(text, before)


def _content(text: str, before: str) -> str | None:
    m = RESPONSE_RE.search(text)
    if m is not None:
        return m["c"] or None
    return _strip_response(before)


def split_reasoning(text: str, request: dict[str, Any], thinking: bool
                    ) -> tuple[str | None, str | None]:
    """`KimiK3ReasoningParser.extract_reasoning`: the reasoning (not stripped) and the rest,
    handed on raw when the tool parser will read it, else unwrapped here."""

    def rest(after: str) -> str | None:
        if preserves_tool_channels(request):
            return after or None
        return _strip_wrapper(after) or None

    if not thinking:
        return None, rest(text)
    m_open = THINK_OPEN_RE.search(text)
    start = m_open.end() if m_open else 0
    m_close = THINK_CLOSE_RE.search(text, start)
    if m_open is None and m_close is None and RESPONSE_OPEN_RE.search(text):
        return None, rest(text)
    if m_close is not None:
        return text[start:m_close.start()] or None, rest(text[m_close.end():])
    return text[start:] or None, None


def parse(out: Output, request: dict[str, Any], *, stream: bool = False,
          marker_ids: MarkerIds | None = None, prompt_ids: Sequence[int] = ()) -> Parsed:
    """The fields vLLM returns for the detokenized `out`, plain or streamed (the stream needs
    the marker ids and the prompt ids)."""
    if stream:
        if marker_ids is None:
            raise ValueError("the streamed parse needs the marker ids")
        return run_stream(out, request, marker_ids, prompt_ids)
    return parse_plain(out.text, request, truncated=out.truncated)


def parse_plain(text: str, request: dict[str, Any], *, truncated: bool) -> Parsed:
    """`DelegatingParser.parse` with `KimiK3Parser._extract_tool_calls`, then the serving
    layer's message and finish reason (`chat_completion_full_generator`)."""
    thinking = parser_thinking(request)
    reasoning, content = split_reasoning(text, request, thinking)
    called, calls, parsed_content = extract_tools(content or "")
    choice = tool_choice(request)
    finish = "length" if truncated else "stop"
    if choice == "none":
        return Parsed(reasoning, parsed_content, (), finish)
    if not called:
        content, calls = parsed_content, []
    else:
        content = parsed_content if parsed_content and parsed_content.strip() else None
    server_calls = tuple(ServerCall(n, a, k) for k, (n, a) in enumerate(calls))
    if choice is None:
        return Parsed(reasoning, content, (), finish)
    if choice == "required" or isinstance(choice, dict):
        # `required` reports `tool_calls` after any stop, calls or not; a named choice never.
        finish = "tool_calls" if choice == "required" and not truncated else finish
        return Parsed(reasoning, content or "", server_calls, finish)
    # auto: `tool_calls` whenever calls came back, also after a length stop.
    return Parsed(reasoning, content, server_calls, "tool_calls" if server_calls else finish)


# ---------------------------------------------------------------------------------------------
# The stream


@dataclass(frozen=True, slots=True)
class MarkerIds:
    """The id sequences the reasoning parser matches (`tokenizer.encode` of the marker
    strings: marker, tag name, marker)."""

    think_open: tuple[int, ...]
    think_close: tuple[int, ...]
    response_open: tuple[int, ...]

    @classmethod
    def of(cls, tok: Tokenizer) -> MarkerIds:
        def seq(first: str, name: str) -> tuple[int, ...]:
            return (tok.token_id(first), *tok.encode_ordinary(name), tok.token_id(SEP))

        return cls(seq(OPEN, "think"), seq(CLOSE, "think"), seq(OPEN, "response"))


def _at(ids: Sequence[int], i: int, needle: Sequence[int]) -> bool:
    return i + len(needle) <= len(ids) and all(ids[i + k] == needle[k]
                                               for k in range(len(needle)))


def _last_index(ids: Sequence[int], needle: Sequence[int]) -> int:
    for i in range(len(ids) - len(needle), -1, -1):
        if _at(ids, i, needle):
            return i
    return -1


def newest_is_close(ids: Sequence[int], markers: MarkerIds) -> bool:
    """Scanning back, a think-close id sequence comes before any think-open one."""
    for i in range(len(ids) - 1, -1, -1):
        if _at(ids, i, markers.think_close):
            return True
        if _at(ids, i, markers.think_open):
            return False
    return False


def count_reasoning_tokens(ids: Sequence[int], markers: MarkerIds, thinking: bool) -> int:
    """`count_reasoning_tokens`: tokens from the start until a think-close sequence (or a
    response-open before any think-open), think-open re-entering; marker sequences are not
    counted. The stop token counts when reasoning never ended."""
    if not thinking:
        return 0
    count = 0
    inside = True
    seen_open = False
    i = 0
    while i < len(ids):
        if _at(ids, i, markers.think_open):
            inside = seen_open = True
            i += len(markers.think_open)
            continue
        if _at(ids, i, markers.think_close):
            inside = False
            i += len(markers.think_close)
            continue
        if not seen_open and _at(ids, i, markers.response_open):
            inside = False
            i += len(markers.response_open)
            continue
        count += inside
        i += 1
    return count


def _reasoning_ready(text: str) -> str:
    """The reasoning prefix safe to send: after any think-open, minus a tail that could start
    a think marker."""
    m_open = THINK_OPEN_RE.search(text)
    if m_open is not None:
        text = text[m_open.end():]
    held = max(tag_overlap(text, THINK_OPEN), tag_overlap(text, THINK_CLOSE))
    return text[:-held] if held else text


@dataclass(frozen=True, slots=True)
class StreamDelta:
    reasoning: str | None = None
    content: str | None = None
    calls: tuple[tuple[str, str], ...] = ()


@dataclass
class StreamParser:
    """`KimiK3Parser.parse_delta` for one request (the delegating parser's string path, with
    both K3 parsers): feed each detokenizer step with `step`."""

    thinking: bool
    markers: MarkerIds
    tool_choice: Any
    reasoning_ended: bool = False
    tool_text_started: bool = False
    previous_text: str = ""
    previous_ids: list[int] = field(default_factory=list)
    # The reasoning parser's note of the content ids at the step the reasoning ended.
    cached_delta: tuple[int, ...] | None = None
    cached_content: list[int] | None = None
    # The tool parser's streaming state.
    sent_content: int = 0
    sent_calls: int = 0

    @classmethod
    def for_request(cls, request: dict[str, Any], markers: MarkerIds,
                    prompt_ids: Sequence[int]) -> StreamParser:
        thinking = parser_thinking(request)
        parser = cls(thinking, markers, tool_choice(request))
        # The prompt check: reasoning is over before the first step when thinking is off, or
        # when the prompt's newest think marker is a close (the generation prompt ends in a
        # think-open, so a thinking request starts in reasoning).
        parser.reasoning_ended = not thinking or newest_is_close(prompt_ids, markers)
        return parser

    # -- the reasoning parser

    def _reasoning_step(self, previous: str, current: str, delta_text: str,
                        current_ids: list[int], delta_ids: list[int]) -> StreamDelta | None:
        self.cached_delta = self.cached_content = None
        if THINK_CLOSE_RE.search(previous):
            return StreamDelta(content=delta_text)
        m_close = THINK_CLOSE_RE.search(current)
        if m_close is not None:
            self.cached_delta = tuple(delta_ids)
            self.cached_content = self._content_ids(current_ids)
            m_open = THINK_OPEN_RE.search(current)
            reasoning = current[m_open.end() if m_open else 0:m_close.start()]
            sent = _reasoning_ready(previous)
            piece = reasoning[len(sent):] if reasoning.startswith(sent) else reasoning
            return StreamDelta(reasoning=piece or None,
                               content=current[m_close.end():] or None)
        now, before = _reasoning_ready(current), _reasoning_ready(previous)
        piece = now[len(before):] if now.startswith(before) else now
        return StreamDelta(reasoning=piece) if piece else None

    def _content_ids(self, ids: list[int]) -> list[int]:
        at = _last_index(ids, self.markers.think_close)
        return [] if at == -1 else ids[at + len(self.markers.think_close):]

    def _ends_reasoning(self, current_ids: list[int], delta_ids: list[int]) -> bool:
        if not delta_ids:
            return False
        carry = max(len(self.markers.think_close), len(self.markers.think_open)) - 1
        head = len(current_ids) - len(delta_ids)
        window = current_ids[max(0, head - carry):head] + delta_ids
        return newest_is_close(window, self.markers)

    # -- the tool parser

    def _response_content(self, current: str) -> str | None:
        m_open = RESPONSE_OPEN_RE.search(current)
        body = m_open.end() if m_open else 0
        ends = [m.start() for m in (TOOLS_OPEN_RE.search(current, body),
                                    RESPONSE_CLOSE_RE.search(current, body)) if m]
        if ends:
            sendable = min(ends)
        else:
            sendable = len(current) - max(tag_overlap(current, RESPONSE_OPEN),
                                          tag_overlap(current, RESPONSE_CLOSE),
                                          tag_overlap(current, TOOLS_OPEN))
        if sendable <= body:
            return None
        self.sent_content = max(self.sent_content, body)
        if sendable <= self.sent_content:
            return None
        piece = current[self.sent_content:sendable]
        self.sent_content = sendable
        return piece or None

    def _tools_step(self, current: str) -> StreamDelta | None:
        content = self._response_content(current)
        m_tools = TOOLS_OPEN_RE.search(current)
        calls = section_calls(current[m_tools.end():]) if m_tools else []
        if len(calls) <= self.sent_calls:
            return StreamDelta(content=content) if content else None
        new = calls[self.sent_calls:]
        self.sent_calls = len(calls)
        if self.tool_choice == "none":
            # Parsed, then thrown away (`KimiK3Parser._extract_tool_calls_streaming`).
            return StreamDelta(content=content) if content else StreamDelta()
        return StreamDelta(content=content, calls=tuple(new))

    # -- one step

    def step(self, delta_text: str, delta_ids: Sequence[int]) -> StreamDelta | None:
        delta_ids = list(delta_ids)
        current = self.previous_text + delta_text
        current_ids = self.previous_ids + delta_ids
        message: StreamDelta | None = None
        if not self.reasoning_ended:
            message = self._reasoning_step(self.previous_text, current, delta_text,
                                           current_ids, delta_ids)
            if self._ends_reasoning(current_ids, delta_ids):
                self.reasoning_ended = True
                if self.cached_delta == tuple(delta_ids) and self.cached_content is not None:
                    current_ids = self.cached_content
                else:
                    current_ids = self._content_ids(delta_ids)
                self.cached_delta = self.cached_content = None
                current = (message.content if message else None) or ""
        if self.reasoning_ended:
            if not self.tool_text_started:
                self.tool_text_started = True
                self.previous_text, self.previous_ids = "", []
            reasoning = message.reasoning if message else None
            message = self._tools_step(current)
            if reasoning:
                message = (StreamDelta(reasoning=reasoning) if message is None else
                           StreamDelta(message.reasoning or reasoning, message.content,
                                       message.calls))
        self.previous_text, self.previous_ids = current, current_ids
        return message


def run_stream(out: Output, request: dict[str, Any], markers: MarkerIds,
               prompt_ids: Sequence[int]) -> Parsed:
    """What the vLLM stream adds up to: each detokenizer step through `StreamParser`, then the
    stop token's step (its text is ""); `tool_calls` only after a stop (not a length cut)."""
    parser = StreamParser.for_request(request, markers, prompt_ids)
    steps = [(d.text, [d.token_id]) for d in out.deltas]
    if out.stop_id is not None:
        steps.append(("", [out.stop_id]))
    return collect(parser, steps, truncated=out.truncated)


def collect(parser: StreamParser, steps: Sequence[tuple[str, Sequence[int]]], *,
            truncated: bool) -> Parsed:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, str]] = []
    at_calls: list[int] = []
    for text, ids in steps:
        delta = parser.step(text, ids)
        if delta is None:
            continue
        if delta.reasoning:
            reasoning.append(delta.reasoning)
        if delta.content:
            content.append(delta.content)
        for call in delta.calls:
            at_calls.append(sum(map(len, content)))
            calls.append(call)
    named = isinstance(parser.tool_choice, dict)
    finish = "length" if truncated else "tool_calls" if calls and not named else "stop"
    return Parsed("".join(reasoning) or None, "".join(content) or None,
                  tuple(ServerCall(n, a, k) for k, (n, a) in enumerate(calls)), finish,
                  tuple(at_calls))

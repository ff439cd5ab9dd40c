"""What a vLLM server (`--reasoning-parser qwen3 --tool-call-parser hermes`) and an SGLang server
(`--reasoning-parser qwen3 --tool-call-parser qwen25`) make of a Qwen3 request and
completion: a re-statement, in our own code, of the upstream behaviour described in
docs/qwen3.md, which names the upstream files and functions each rule comes from.

The parsers see the completion as the detokenizer gives it: the stop token (`<|im_end|>` or
`<|endoftext|>`) is not in the text; `<think>`, `</think>`, `<tool_call>`, `</tool_call>` are
(added, not special), so a marker the model wrote as plain characters looks exactly like the
real token to every string rule. The streaming paths also see each step's token ids.

This module depends on nothing in `specregen.emulator`; the emulator wires it in.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.qwen3.render import render_with_template, template_text
from specregen.models.qwen3.tokens import (
    ENDOFTEXT,
    IM_END,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
)
from specregen.models.tokenizer import Tokenizer


class RequestError(ValueError):
    """A request the server refuses (vLLM answers 400)."""


@dataclass(frozen=True, slots=True)
class Delta:
    """One decode step: the text it added ("" while a UTF-8 character is incomplete) and the
    token id."""

    text: str
    token_id: int


@dataclass(frozen=True, slots=True)
class Output:
    text: str
    deltas: tuple[Delta, ...]
    truncated: bool  # stopped on max_tokens, not on a stop token


@dataclass(frozen=True, slots=True)
class ServerCall:
    name: str
    arguments: str
    index: int  # ids are random (`chatcmpl-tool-...`); the emulator makes them


@dataclass(frozen=True, slots=True)
class Parsed:
    reasoning: str | None
    content: str | None
    calls: tuple[ServerCall, ...]
    finish_reason: str


@dataclass(frozen=True, slots=True)
class MarkerIds:
    think: int
    think_end: int
    tool_call: int
    tool_call_end: int
    stops: tuple[int, ...]

    @classmethod
    def of(cls, tok: Tokenizer) -> MarkerIds:
        return cls(tok.token_id(THINK), tok.token_id(THINK_END), tok.token_id(TOOL_CALL),
                   tok.token_id(TOOL_CALL_END), (tok.token_id(IM_END), tok.token_id(ENDOFTEXT)))


# ---------------------------------------------------------------------------------------------
# Request side


def template_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    kwargs = request.get("chat_template_kwargs")
    return kwargs if isinstance(kwargs, dict) else {}


def parser_thinking(request: dict[str, Any]) -> bool:
    """Thinking as the qwen3 reasoning parser reads it: `enable_thinking`, default on; any
    falsy value turns it off (the template only reacts to exactly `false`)."""
    return bool(template_kwargs(request).get("enable_thinking", True))


def parses_tools(request: dict[str, Any]) -> bool:
    """The hermes parser runs when the request sent tools and did not say "none" (`required`
    and named choices take vLLM's JSON path; treated as auto here, as for Kimi)."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts vLLM hands to the template: history arguments parsed to objects (so
    `tojson` dumps them again; empty means `{}`), text-part lists joined with newlines (the
    template is string-content), null content as "", an earlier answer's reasoning read from
    `reasoning` only and passed also as `reasoning_content` (the name the Qwen3 template reads).
    A client's `reasoning_content` is dropped: vLLM main reads only `reasoning`
    (`chat_utils._parse_chat_message_content`, vllm-project/vllm#38488, open)."""
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise RequestError(f"messages[{i}].content[{j}]: only text parts are "
                                       "supported for Qwen3")
                texts.append(part.get("text") or "")
            content = "\n".join(texts)
        new: dict[str, Any] = {"role": role, "content": "" if content is None else content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                new["tool_calls"] = [_server_call(i, j, c) for j, c in enumerate(calls)]
            reasoning = message.get("reasoning")
            if reasoning is not None:
                new["reasoning"] = new["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            new["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            new["name"] = message["name"]
        out.append(new)
    return out


def _server_call(i: int, j: int, call: dict[str, Any]) -> dict[str, Any]:
    call = copy.deepcopy(call)
    fn = call.get("function") or {}
    args = fn.get("arguments")
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where} is not valid JSON: {exc}") from None
    call["function"] = fn
    return call


def render_prompt_text(request: dict[str, Any], template: str | None = None) -> str:
    """The prompt vLLM renders: its message preprocessing, then the chat template through
    transformers with the request's `chat_template_kwargs`."""
    kwargs = template_kwargs(request)
    return render_with_template(
        template if template is not None else template_text(),
        server_messages(request["messages"]),
        request.get("tools") or None,
        enable_thinking=kwargs.get("enable_thinking"),
    )


def encode_prompt(request: dict[str, Any], tok: Tokenizer, template: str | None = None
                  ) -> list[int]:
    return tok.encode_with_specials(render_prompt_text(request, template))


# ---------------------------------------------------------------------------------------------
# Completion side


def decode_output(ids: Sequence[int], tok: Tokenizer, truncated: bool) -> Output:
    """Incremental detokenization as vLLM's detokenizer does it: the tokens since the last
    emitted text are decoded together and held back while the result ends in U+FFFD (an
    incomplete UTF-8 character); a stop token ends the text and is not in it. (Decoding through
    the tokenizer, not byte tables: the Hugging Face wrapper's `decode_bytes` cannot return a
    partial character.)"""
    stops = MarkerIds.of(tok).stops
    deltas: list[Delta] = []
    pending: list[int] = []
    for token_id in ids:
        if token_id in stops:
            break
        pending.append(token_id)
        text = tok.decode(pending)
        if text.endswith("\ufffd"):
            deltas.append(Delta("", token_id))
            continue
        deltas.append(Delta(text, token_id))
        pending = []
    return Output("".join(d.text for d in deltas), tuple(deltas), truncated)


def parse(out: Output, request: dict[str, Any], ids: MarkerIds, *, stream: bool,
          prompt_ids: Sequence[int] = ()) -> Parsed:
    """The fields vLLM returns. The stream also needs the prompt ids (see `_stream`)."""
    if stream:
        return _stream(out, request, ids, prompt_ids)
    return _plain(out, request)


# -- qwen3 reasoning parser ---------------------------------------------------------------------

_FUNCTION_OPEN = re.compile(r"<function[\s=]")


def split_reasoning(text: str, thinking: bool) -> tuple[str | None, str | None]:
    """`Qwen3ReasoningParser.extract_reasoning`."""
    before, found, after = text.partition(THINK)
    text = after if found else before
    if THINK_END in text:
        reasoning, _, content = text.partition(THINK_END)
        return reasoning, content or None
    if not thinking:
        return None, text
    at = text.find(TOOL_CALL)
    if at != -1 and _FUNCTION_OPEN.match(text[at + len(TOOL_CALL):].lstrip()):
        # Qwen3.5's XML calls end reasoning implicitly; Qwen3's JSON calls never match this.
        return text[:at] or None, text[at:] or None
    return text, None


def prompt_ends_reasoning(prompt_ids: Sequence[int], ids: MarkerIds) -> bool:
    """`Qwen3ReasoningParser.is_reasoning_end` on the prompt: scanning back, `</think>` before
    any `<think>` means reasoning is over. An agentic prompt whose last assistant turn kept its
    think block therefore counts as ended, and the stream then sends the new reasoning as
    content. A `<tool_call>` with a later `</tool_call>` is skipped; a lone one counts only
    before `<function` (never in Qwen3's JSON format)."""
    for i in range(len(prompt_ids) - 1, -1, -1):
        token_id = prompt_ids[i]
        if token_id == ids.think:
            return False
        if token_id == ids.think_end:
            return True
    return False


# -- hermes tool parser -------------------------------------------------------------------------

_CALL_BLOCK = re.compile(re.escape(TOOL_CALL) + "(.*?)" + re.escape(TOOL_CALL_END) + "|"
                         + re.escape(TOOL_CALL) + "(.*)", re.DOTALL)


def hermes_extract(text: str) -> tuple[bool, tuple[ServerCall, ...], str | None]:
    """`Hermes2ProToolParser.extract_tool_calls`: (tools_called, calls, content). One failing
    block (bad JSON, no name or arguments) makes the whole text content again."""
    if TOOL_CALL not in text:
        return False, (), text
    try:
        calls = []
        for k, match in enumerate(_CALL_BLOCK.finditer(text)):
            value = json.loads(match.group(1) if match.group(1) is not None else match.group(2))
            calls.append(ServerCall(value["name"], json.dumps(value["arguments"],
                                                              ensure_ascii=False), k))
    except (ValueError, KeyError, TypeError):
        return False, (), text
    content = text[: text.find(TOOL_CALL)]
    return True, tuple(calls), content or None


def _plain(out: Output, request: dict[str, Any]) -> Parsed:
    reasoning, content = split_reasoning(out.text, parser_thinking(request))
    finish = "length" if out.truncated else "stop"
    if parses_tools(request):
        called, calls, rest = hermes_extract(content if content is not None else "")
        if called:
            # The serving layer nulls whitespace-only content next to calls and reports
            # `tool_calls` whenever calls came back (also after a length stop).
            content = rest if rest is not None and rest.strip() else None
            return Parsed(reasoning, content, calls, "tool_calls" if calls else finish)
    return Parsed(reasoning, content, (), finish)


def _partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _is_complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS = re.compile(r'"arguments"\s*:\s*')


def _tool_args(tc_json: str, complete: bool) -> str | None:
    """The arguments value by brace matching (strings respected); a scalar value loses a
    trailing `}` once complete; an unbalanced value is returned as it is."""
    match = _ARGS.search(tc_json)
    if match is None:
        return None
    raw = tc_json[match.end():]
    if not raw or raw[0] not in "{[":
        if complete:
            raw = raw.rstrip()
            if raw.endswith("}"):
                raw = raw[:-1].rstrip()
        return raw
    open_ch, close_ch = raw[0], "}" if raw[0] == "{" else "]"
    depth = 0
    in_str = esc = False
    for i, ch in enumerate(raw):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return raw[: i + 1]
    return raw


def _call_regions(text: str) -> list[tuple[str, bool]]:
    regions = []
    pos = 0
    while (start := text.find(TOOL_CALL, pos)) != -1:
        body = start + len(TOOL_CALL)
        end = text.find(TOOL_CALL_END, body)
        if end != -1:
            regions.append((text[body:end].strip(), True))
            pos = end + len(TOOL_CALL_END)
            continue
        raw = text[body:]
        overlap = _partial_tag_overlap(raw, TOOL_CALL_END)
        if overlap:
            raw = raw[:-overlap]
        tc_json = raw.strip()
        regions.append((tc_json, _is_complete_json(tc_json) if tc_json else False))
        break
    return regions


class _HermesStream:
    """`Hermes2ProToolParser.extract_tool_calls_streaming`, re-run on the whole text at every
    step and diffed against what was sent, as upstream does."""

    def __init__(self) -> None:
        self.sent = 0
        self.content: list[str] = []
        self.names: list[str | None] = []
        self.streamed: list[str] = []  # what the parser thinks it sent, per call
        self.client: list[str] = []  # what the client added up, per call

    def step(self, text: str) -> None:
        if TOOL_CALL in text:
            sendable = text.index(TOOL_CALL)
        else:
            sendable = len(text) - _partial_tag_overlap(text, TOOL_CALL)
        if sendable > self.sent:
            self.content.append(text[self.sent:sendable])
            self.sent = sendable
        for i, (tc_json, complete) in enumerate(_call_regions(text)):
            if i >= len(self.names):
                self.names.append(None)
                self.streamed.append("")
                self.client.append("")
            if self.names[i] is None:
                match = _NAME.search(tc_json)
                if match is None:
                    break  # a later call cannot start before this one has its name
                self.names[i] = match.group(1)
            args = _tool_args(tc_json, complete)
            if args is not None and len(args) > len(self.streamed[i]):
                self.client[i] += args[len(self.streamed[i]):]
                self.streamed[i] = args

    def calls(self) -> tuple[ServerCall, ...]:
        return tuple(ServerCall(name, args, i)
                     for i, (name, args) in enumerate(zip(self.names, self.client, strict=True))
                     if name is not None)


class _ReasoningStream:
    """`Qwen3ReasoningParser.extract_reasoning_streaming` for one step, including its hold-back
    of a `<tool_call>` met inside the reasoning until the following text shows it is not a
    Qwen3.5 `<function=` call (then it is flushed as reasoning; at the end it is lost)."""

    def __init__(self, ids: MarkerIds) -> None:
        self.ids = ids
        self.pending: str | None = None

    def step(self, delta: Delta, seen_end_before: bool) -> tuple[str | None, str | None]:
        text = delta.text
        tid = delta.token_id
        if tid == self.ids.think and (at := text.find(THINK)) >= 0:
            text = text[at + len(THINK):]
        if tid == self.ids.think_end:
            at = text.find(THINK_END)
            if at >= 0:
                return text[:at] or None, text[at + len(THINK_END):] or None
            return None, None
        if self.pending is not None:
            candidate = (self.pending[len(TOOL_CALL):] + text).lstrip()
            if (not candidate or "<function".startswith(candidate)
                    or candidate.startswith("<function")):
                self.pending += text
                return None, None
            flushed, self.pending = self.pending + text, None
            return flushed, None
        if tid == self.ids.tool_call and (at := text.find(TOOL_CALL)) >= 0:
            # The look-ahead has nothing to see yet at this step: hold the tag back.
            self.pending = text[at:]
            return text[:at] or None, None
        if not text:
            return None, None
        if seen_end_before:
            return None, text
        return text, None


def _stream(out: Output, request: dict[str, Any], ids: MarkerIds,
            prompt_ids: Sequence[int]) -> Parsed:
    """What the vLLM stream adds up to, field by field.

    Reasoning is over before the first step when the prompt says so (`prompt_ends_reasoning`:
    `enable_thinking: false`, and also any prompt whose last think block is closed, such as a
    tool loop); then every step is content. Otherwise each step goes through the reasoning
    parser until the `</think>` token. After that, with tools, the text goes through the
    hermes stream: content before the first `<tool_call>` (a possible partial tag at the end
    is held back and never sent), each call's name, and its arguments as the model wrote them
    (not re-dumped); text after a call is not sent.
    """
    ended = prompt_ends_reasoning(prompt_ids, ids)
    tools = parses_tools(request)
    reasoning: list[str] = []
    content_steps: list[str] = []
    parser = _ReasoningStream(ids)
    seen_end = False
    for delta in out.deltas:
        if ended:
            content_steps.append(delta.text)
            continue
        r_text, c_text = parser.step(delta, seen_end)
        if delta.token_id == ids.think_end:
            seen_end = ended = True
        if r_text:
            reasoning.append(r_text)
        if c_text:
            content_steps.append(c_text)
    finish = "length" if out.truncated else "stop"
    if not tools:
        content = "".join(content_steps)
        return Parsed("".join(reasoning) if reasoning else None, content or None, (), finish)
    hermes = _HermesStream()
    text = ""
    for piece in content_steps:
        text += piece
        hermes.step(text)
    calls = hermes.calls()
    content = "".join(hermes.content)
    if calls and not out.truncated:
        finish = "tool_calls"
    return Parsed("".join(reasoning) if reasoning else None, content or None, calls, finish)


# ---------------------------------------------------------------------------------------------
# SGLang: `--reasoning-parser qwen3 --tool-call-parser qwen25` (docs/qwen3.md; the stream below)

SGLANG_CALL_OPEN = TOOL_CALL + "\n"  # `Qwen25Detector.bot_token`
SGLANG_CALL_CLOSE = "\n" + TOOL_CALL_END  # `Qwen25Detector.eot_token`
_SGLANG_BLOCK = re.compile(re.escape(SGLANG_CALL_OPEN) + "(.*?)" + re.escape(SGLANG_CALL_CLOSE),
                           re.DOTALL)


def sglang_server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts SGLang hands to the template (`serving_chat._apply_jinja_template`):
    each message is its request model's dump, so a non-user message carries `tool_call_id`,
    `name`, `reasoning_content` and `tool_calls` (None when absent; `reasoning` is not a field
    and is dropped); history arguments must be JSON objects (`parse_tool_call_arguments`, else
    400); a tool message's text parts are joined with spaces (`normalize_tool_content`); null
    content is ""; a final assistant message becomes a user message
    (`_handle_last_assistant_message`, no `continue_final_message`)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            if role != "tool" or not all(
                    isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
                    for p in content):
                raise RequestError(f"messages[{i}].content: a list is restated for tool "
                                   "messages of text parts only (SGLang profile)")
            content = " ".join(p if isinstance(p, str) else p.get("text", "") for p in content)
        if role == "user":
            out.append({"role": role, "content": "" if content is None else content})
            continue
        calls = message.get("tool_calls")
        dumped = None
        if isinstance(calls, list):
            dumped = []
            for j, call in enumerate(calls):
                fn = call.get("function") or {}
                args = fn.get("arguments")
                if role == "assistant" and isinstance(args, str):
                    args = _sglang_arguments(i, j, args)
                dumped.append({"id": call.get("id"), "index": call.get("index"),
                               "type": call.get("type", "function"),
                               "function": {"name": fn.get("name"), "arguments": args}})
        out.append({"role": role, "content": "" if content is None else content,
                    "tool_call_id": message.get("tool_call_id"), "name": message.get("name"),
                    "reasoning_content": message.get("reasoning_content"),
                    "tool_calls": dumped})
    if out and out[-1]["role"] == "assistant" and isinstance(out[-1]["content"], str):
        out[-1] = {"role": "user", "content": out[-1]["content"]}
    return out


def _sglang_arguments(i: int, j: int, arguments: str) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        raise RequestError(f"{where}: must be valid JSON") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"{where}: must be a JSON object")
    return parsed


def sglang_render_prompt_text(request: dict[str, Any], template: str | None = None) -> str:
    """The prompt SGLang renders: its message handling, tools left out when `tool_choice` is
    "none", the template through transformers with the request's `enable_thinking`."""
    tools = request.get("tools") or None
    if request.get("tool_choice") == "none":
        tools = None
    return render_with_template(
        template if template is not None else template_text(),
        sglang_server_messages(request["messages"]), tools,
        enable_thinking=template_kwargs(request).get("enable_thinking"))


def sglang_encode_prompt(request: dict[str, Any], tok: Tokenizer, template: str | None = None
                         ) -> list[int]:
    return tok.encode_with_specials(sglang_render_prompt_text(request, template))


def sglang_forces_reasoning(request: dict[str, Any]) -> bool:
    """`serving_chat._get_reasoning_from_request` for the qwen3 parser (`reasoning_default =
    "enable_thinking"`): forced unless the request sets `enable_thinking` to false."""
    return template_kwargs(request).get("enable_thinking") is not False


def sglang_split_reasoning(text: str, forced: bool) -> tuple[str, str]:
    """`BaseReasoningFormatDetector._detect_and_parse_impl` with the `Qwen3Detector` tokens:
    (reasoning, normal text). In reasoning when forced or when `<think>` occurs anywhere;
    leading `<think>` strings are dropped; the split is at the first `</think>`, else at the
    first `<tool_call>` (which stays in the normal text), else everything is reasoning."""
    if not (forced or THINK in text):
        return "", text
    while text.startswith(THINK):
        text = text[len(THINK):]
    if THINK_END not in text:
        at = text.find(TOOL_CALL)
        if at != -1:
            return text[:at], text[at:]
        return text, ""
    reasoning, _, normal = text.partition(THINK_END)
    return reasoning, normal


def qwen25_extract(text: str, tool_names: Sequence[str]
                   ) -> tuple[bool, tuple[ServerCall, ...] | None, str]:
    """`Qwen25Detector.detect_and_parse` + `parse_base_json`, as `_process_tool_calls` uses
    them: (triggered, calls, normal text). Triggered by `<tool_call>\n`; the normal text is
    what precedes it, stripped; each `<tool_call>\n...\n</tool_call>` block is JSON-parsed on
    its own (a bad block is skipped, the others kept); a call to a function not in `tools` is
    dropped; arguments are `json.dumps(..., ensure_ascii=False)` of the parsed value. A block
    that parses to something without `.get` raises in upstream, which then returns the whole
    text as content and no calls (None here)."""
    at = text.find(SGLANG_CALL_OPEN)
    if at == -1:
        return False, (), text
    normal = text[:at].strip()
    calls: list[ServerCall] = []
    for match in _SGLANG_BLOCK.finditer(text):
        try:
            value = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            continue
        for act in value if isinstance(value, list) else [value]:
            if not isinstance(act, dict):
                return True, None, text
            name = act.get("name")
            if name and name in tool_names:
                arguments = act.get("parameters") or act.get("arguments", {})
                calls.append(ServerCall(name, json.dumps(arguments, ensure_ascii=False),
                                        len(calls)))
    return True, tuple(calls), normal


def sglang_parse(out: Output, request: dict[str, Any]) -> Parsed:
    """The fields a non-streamed SGLang answer carries (`_build_chat_response`): reasoning
    (`reasoning_content`, None when empty), content ("" rather than null), calls, finish."""
    reasoning, text = sglang_split_reasoning(out.text, sglang_forces_reasoning(request))
    if template_kwargs(request).get("force_nonempty_content") is True and not text:
        reasoning, text = text, reasoning  # `_maybe_apply_force_nonempty_content`
    finish = "length" if out.truncated else "stop"
    calls: tuple[ServerCall, ...] = ()
    if parses_tools(request):
        names = [t["function"]["name"] for t in request.get("tools") or ()
                 if isinstance(t, dict) and isinstance(t.get("function"), dict)
                 and t["function"].get("name")]
        triggered, found, normal = qwen25_extract(text, names)
        if triggered and found is not None:
            calls, text = found, normal
            if finish == "stop":
                finish = "tool_calls"  # on the marker alone, even when no call parsed
    return Parsed(reasoning or None, text or "", calls, finish)


# -- SGLang's stream (docs/qwen3.md, "SGLang", "Stream") ---------------------------------------


def _is_cjk(ch: str) -> bool:
    """`_is_chinese_char` of transformers' streamer, which SGLang's `find_printable_text`
    borrows: the CJK ideograph blocks."""
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _printable(text: str) -> str:
    """`find_printable_text`: what the detokenizer shows of a step that ends in an incomplete
    character -- all of it after a newline, up to a CJK character, else up to the last
    space."""
    if text.endswith("\n"):
        return text
    if text and _is_cjk(text[-1]):
        return text
    if len(text) > 1 and _is_cjk(text[-2]):
        return text[:-1]
    return text[: text.rfind(" ") + 1]


def sglang_decode_output(ids: Sequence[int], tok: Tokenizer, truncated: bool) -> Output:
    """SGLang's `DetokenizerManager` (incremental decode, one chunk per step): the tokens
    since the last committed text are decoded together; while that ends in U+FFFD nothing is
    committed and the chunk shows only its `find_printable_text` part; the finishing step shows
    everything, an unfinished character as U+FFFD included (no hold-back at the end). The stop
    token is cut from the ids before decoding (`trim_matched_stop`). Each delta is what the
    serving layer adds to its stream buffer (`text[len(stream_buffer):]`); the last delta is
    the finishing step's (the stop token's, "" text, when there is one)."""
    stops = MarkerIds.of(tok).stops
    deltas: list[Delta] = []
    committed = ""
    pending: list[int] = []
    shown = ""  # the cumulative text the client has seen so far
    for k, token_id in enumerate(ids):
        last = k == len(ids) - 1
        if token_id in stops:
            # The finishing step: the pending tokens without the stop token, in full.
            full = committed + (tok.decode(pending) if pending else "")
            deltas.append(Delta(full[len(shown):], token_id))
            shown = full
            break
        pending.append(token_id)
        text = tok.decode(pending)
        if last and truncated:
            full = committed + text
        elif text and not text.endswith("\ufffd"):
            committed += text
            pending = []
            full = committed
        else:
            full = committed + _printable(text)
        deltas.append(Delta(full[len(shown):], token_id))
        shown = full
    return Output(shown, tuple(deltas), truncated)


class _SglangReasoningStream:
    """`BaseReasoningFormatDetector._parse_streaming_increment_impl` with the `Qwen3Detector`
    tokens (`stream_reasoning` true, the request default)."""

    def __init__(self, forced: bool) -> None:
        self.in_reasoning = forced
        self.buffer = ""
        self.stripped = False

    def step(self, new_text: str) -> tuple[str, str]:
        """(reasoning, normal text) for one delta."""
        self.buffer += new_text
        text = self.buffer
        # The whole buffer a proper prefix of a marker: keep buffering (also when it is "").
        if any(m.startswith(text) and m != text for m in (THINK, THINK_END, TOOL_CALL)):
            return "", ""
        if not self.stripped and THINK in text:
            text = text.replace(THINK, "", 1)
            self.stripped = self.in_reasoning = True
        if self.in_reasoning and THINK_END in text:
            at = text.index(THINK_END)
            self.buffer, self.in_reasoning = "", False
            return text[:at], text[at + len(THINK_END):]
        if self.in_reasoning:
            self.buffer = ""
            if TOOL_CALL in text:  # an implicit end of reasoning; the tag stays normal text
                at = text.index(TOOL_CALL)
                self.in_reasoning = False
                return text[:at], text[at:]
            return text, ""
        self.buffer = ""
        return "", text


class _PartialJSONError(ValueError):
    """`partial_json_parser` found nothing it can complete (upstream: MalformedJSON or a
    JSONDecodeError other than "Extra data"; the detector returns an empty result)."""


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _complete_str(text: str, allow_str: bool) -> tuple[int, str | bool] | bool:
    """`partial_json_parser.core.complete.complete_str`: (end, True) for a whole string, else
    (cut, '"') -- a partial escape cut off -- when partial strings are allowed."""
    i = 1
    last_escaped = -1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            last_escaped = i + 1
            if last_escaped == len(text):
                break
            i += 2
            continue
        if ch == '"':
            return i + 1, True
        i += 1
    if not allow_str:
        return False
    i = min(i, len(text))
    for esc, width in (("\\u", 5), ("\\U", 9), ("\\x", 3)):
        at = text.rfind(esc, max(0, i - width), i)
        if at != -1 and at != last_escaped:
            return at, '"'
    return i, '"'


def _complete_any(text: str, allow_str: bool, top: bool = False
                  ) -> tuple[int, str | bool] | bool:
    """`complete_any` with every partial kind allowed but (maybe) strings."""
    i = _skip_blank(text, 0)
    if i >= len(text):
        raise IndexError
    ch = text[i]
    if ch == '"':
        return _complete_str(text, allow_str)
    if ch == "-" and len(text) == 1:
        return False
    if ch in "0123456789" or (ch == "-" and text[1] != "I"):
        return _complete_num(text, top)
    if ch == "[":
        return _complete_container(text, allow_str, "]")
    if ch == "{":
        return _complete_container(text, allow_str, "}")
    for word in ("null", "true", "false", "Infinity", "-Infinity", "NaN"):
        if text.startswith(word):
            return len(word), True
        if word.startswith(text):
            return 0, word
    raise _PartialJSONError(f"unexpected character {ch!r}")


def _complete_num(text: str, top: bool) -> tuple[int, str | bool]:
    i = 1
    while i < len(text) and text[i] in "1234567890.-+eE":
        i += 1
    modified = False
    while text[i - 1] in ".-+eE":
        modified = True
        i -= 1
    if modified or (i == len(text) and not top):
        return i, ""
    return i, True


def _complete_container(text: str, allow_str: bool, close: str
                        ) -> tuple[int, str | bool]:
    """`complete_obj` / `complete_arr`: the members up to the last complete one, closed."""
    i = j = 1
    try:
        while True:
            j = _skip_blank(text, j)
            if text[j] == close:
                return j + 1, True
            if close == "}":
                if text[j] != '"':
                    raise _PartialJSONError("expected a key")
                key = _complete_str(text[j:], allow_str)
                if not (key and key[1] is True):  # type: ignore[index]
                    return i, close
                j += key[0]  # type: ignore[index]
                j = _skip_blank(text, j)
                if text[j] != ":":
                    raise _PartialJSONError("expected ':'")
                j = _skip_blank(text, j + 1)
            value = _complete_any(text[j:], allow_str)
            if value is False:
                return i, close
            if value[1] is True:  # type: ignore[index]
                i = j = j + value[0]  # type: ignore[index]
            else:
                # value is (end, closing text) here: _complete_any's False and (end, True)
                # were handled above, which its union return type cannot say.
                return j + value[0], value[1] + close  # type: ignore[index,operator,return-value]
            j = _skip_blank(text, j)
            if text[j] == ",":
                j += 1
            elif text[j] == close:
                return j + 1, True
            else:
                raise _PartialJSONError(f"expected ',' or {close!r}")
    except IndexError:
        return i, close


def _partial_loads(text: str, allow_str: bool) -> tuple[Any, int]:
    """`_partial_json_loads` (sglang `function_call/utils.py`) over `partial_json_parser.loads`:
    (value, characters consumed). Balanced brackets: `json.loads` of the whole text, and on
    "Extra data" the first value by `raw_decode`; otherwise the text is completed as `fix`
    does (a partial string dropped with its key when strings are not allowed). Checked equal
    to partial-json-parser 0.2.1.1.post7 (`fix_fast`) on every prefix of 300 call bodies
    during development (docs/qwen3.md)."""
    depth = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    if depth <= 0:
        try:
            return json.loads(text), len(text)
        except json.JSONDecodeError as exc:
            if "Extra data" in exc.msg:
                return json.JSONDecoder().raw_decode(text)
            raise _PartialJSONError(str(exc)) from None
    try:
        stripped = text.strip()
        result = _complete_any(stripped, allow_str, top=True)
    except IndexError:
        raise _PartialJSONError("nothing to complete") from None
    if result is False:
        raise _PartialJSONError("partial value not allowed")
    end, tail = result  # type: ignore[misc]
    if tail is True:
        # A whole first value with more after it (`fix_fast` completes the rest, and
        # `json.loads` then fails on "Extra data": `raw_decode` gives the first value).
        return json.loads(text[:end]), end
    completed = text[:end] + tail  # type: ignore[operator]  # a str: True returned above
    try:
        value = json.loads(completed)
    except json.JSONDecodeError as exc:
        if "Extra data" in exc.msg:
            return json.JSONDecoder().raw_decode(completed)[0], len(text)
        raise _PartialJSONError(str(exc)) from None
    return value, len(text)


def _ends_with_partial(buffer: str, token: str) -> int:
    """`BaseFormatDetector._ends_with_partial_token`."""
    for i in range(1, min(len(buffer) + 1, len(token))):
        if token.startswith(buffer[-i:]):
            return i
    return 0


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@dataclass(slots=True)
class _CallItem:
    index: int
    name: str | None  # set on a call's first item only
    arguments: str


class _Qwen25Stream:
    """`Qwen25Detector.parse_streaming_increment` (qwen25_detector.py@44484b1: a hold-back of a
    `</tool_call>` split over deltas) over `BaseFormatDetector.parse_streaming_increment`
    (base_format_detector.py@00a35ca: partial-JSON streaming); docs/qwen3.md, "Stream"."""

    def __init__(self, tool_names: Sequence[str]) -> None:
        self.names = set(tool_names)
        self.buffer = ""
        self.prev: list[dict[str, Any]] = []
        self.current = -1
        self.name_sent = False
        self.streamed: list[str] = []
        self.normal_buffer = ""

    def step(self, new_text: str) -> tuple[str, list[_CallItem]]:
        normal, items = self._base(new_text)
        if normal:  # Qwen25Detector: `</tool_call>` removed, a partial one held back
            self.normal_buffer += normal
            end = TOOL_CALL_END
            if end in self.normal_buffer:
                normal, self.normal_buffer = self.normal_buffer.replace(end, ""), ""
            elif (k := _ends_with_partial(self.normal_buffer, end)):
                normal, self.normal_buffer = self.normal_buffer[:-k], self.normal_buffer[-k:]
            else:
                normal, self.normal_buffer = self.normal_buffer, ""
        return normal, items

    def _base(self, new_text: str) -> tuple[str, list[_CallItem]]:
        """`BaseFormatDetector.parse_streaming_increment`."""
        self.buffer += new_text
        text = self.buffer
        bot, eot, sep = SGLANG_CALL_OPEN, SGLANG_CALL_CLOSE, "\n"
        # `has_tool_call` (`<tool_call>\n` anywhere in the buffer), or the separator opening the
        # buffer once a call is done: the latter keeps every "\n" after a call -- and all text
        # after the calls -- in the buffer, never sent.
        if not (bot in text or (self.current > 0 and text.startswith(sep))):
            if _ends_with_partial(text, bot):
                return "", []
            self.buffer = ""
            return text.replace(eot, "") if eot in text else text, []
        pos = text.find(bot)
        if pos != -1:
            start = pos + len(bot)
        elif self.current > 0 and text.startswith(sep):
            start = len(sep)
        else:
            start = 0
        if start >= len(text):
            return "", []
        try:
            obj, end = _partial_loads(text[start:], allow_str=self.name_sent)
        except (_PartialJSONError, RecursionError):
            return "", []
        if not isinstance(obj, dict):
            return "", []  # upstream fails on `.get` and logs: an empty result
        complete = _is_complete_json(text[start:start + end])
        if "name" in obj and obj["name"] not in self.names:
            self.buffer, self.current, self.name_sent = "", -1, False
            if self.streamed:
                self.streamed.pop()
            return "", []
        if "parameters" in obj:
            if "arguments" in obj:
                return "", []  # upstream's assert, caught and logged
            obj["arguments"] = obj["parameters"]
        if not obj:
            return "", []
        items: list[_CallItem] = []
        if not self.name_sent:
            name = obj.get("name")
            if name and name in self.names:
                if self.current == -1:
                    self.current = 0
                    self.streamed.append("")
                while len(self.streamed) <= self.current:
                    self.streamed.append("")
                items.append(_CallItem(self.current, name, ""))
                self.name_sent = True
            return "", items
        args = obj.get("arguments")
        if not args:  # `{}` (falsy) is never streamed, and its call never completes
            return "", items
        sent = len(self.streamed[self.current])
        cur = json.dumps(args)  # ASCII escapes: not the model's text
        prev = (self.prev[self.current].get("arguments")
                if self.current < len(self.prev) else None)
        diff = None
        index = self.current
        if complete:
            diff = cur[sent:]
            self.buffer = text[start + end:]
        elif prev:
            prev_json = json.dumps(prev)
            if cur != prev_json:
                diff = _common_prefix(prev_json, cur)[sent:]
        while len(self.prev) <= self.current:
            self.prev.append({})
        self.prev[self.current] = obj
        if complete:
            self.name_sent = False
            self.current += 1
        if diff is not None:
            items.append(_CallItem(index, None, diff))
            self.streamed[index] += diff
        return "", items

    def unstreamed(self) -> tuple[int, str] | None:
        """`_check_for_unstreamed_tool_args` at the finishing chunk: the last tracked call's
        arguments, `json.dumps(ensure_ascii=False)`, less the first occurrence of what was
        streamed for it (nothing when that is not inside)."""
        if not self.prev or not self.streamed:
            return None
        index = len(self.prev) - 1
        if index >= len(self.streamed):
            return None
        expected = json.dumps(self.prev[index].get("arguments", {}), ensure_ascii=False)
        actual = self.streamed[index]
        rest = expected.replace(actual, "", 1) if actual in expected else ""
        return (index, rest) if rest else None


@dataclass(frozen=True, slots=True)
class StreamParsed:
    """What an SGLang stream adds up to: the fields, and for each call how many characters of
    content the stream had sent before the call's first delta (content can follow a call)."""

    parsed: Parsed
    content_at_calls: tuple[int, ...]


def sglang_stream(out: Output, request: dict[str, Any]) -> StreamParsed:
    """`_generate_chat_stream`, chunk by chunk (one per decode step, `out` from
    `sglang_decode_output`): the reasoning parser on each delta, then -- with tools -- the
    qwen25 detector on its normal text (also on empty deltas), call items as they come, and at
    the finishing chunk the unstreamed-arguments top-up. Finish: `tool_calls` when any call
    item was sent and the engine stopped on a stop token."""
    reasoning_parser = _SglangReasoningStream(sglang_forces_reasoning(request))
    tools = parses_tools(request)
    names = [t["function"]["name"] for t in request.get("tools") or ()
             if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and t["function"].get("name")]
    detector = _Qwen25Stream(names)
    reasoning: list[str] = []
    content = ""
    call_names: dict[int, str] = {}
    call_args: dict[int, str] = {}
    at: dict[int, int] = {}
    for k, delta in enumerate(out.deltas):
        r_text, text = reasoning_parser.step(delta.text)
        if r_text:
            reasoning.append(r_text)
        if not tools:
            content += text
            continue
        normal, items = detector.step(text)
        content += normal
        for item in items:
            if item.name is not None:
                # A call's first item: id and name (a repeated first item would be a new
                # entry in the client's list at the same index; not reached here).
                call_names.setdefault(item.index, item.name)
                at.setdefault(item.index, len(content))
            call_args[item.index] = call_args.get(item.index, "") + item.arguments
        if k == len(out.deltas) - 1 and (rest := detector.unstreamed()) is not None:
            index, piece = rest
            call_args[index] = call_args.get(index, "") + piece
    finish = "length" if out.truncated else "stop"
    if call_args and finish == "stop":
        finish = "tool_calls"
    order = sorted(call_names)
    calls = tuple(ServerCall(call_names[i], call_args.get(i, ""), i) for i in order)
    return StreamParsed(Parsed("".join(reasoning) or None, content, calls, finish),
                        tuple(at[i] for i in order))


# ---------------------------------------------------------------------------------------------
# The model side (for an emulator)


def model_ids(tok: Tokenizer, *, reasoning: str | None, content: str,
              calls: Sequence[tuple[str, str]], stop: bool = True) -> list[int]:
    """Ids of an answer written the way Qwen3 writes one (the chat template's layout), built
    from segments: marker ids, and the BPE ids of the text between them. `reasoning` is the
    think-block body without its surrounding newlines (None: thinking off, the prompt already
    closed the block); `calls` are (name, arguments text as the model writes it).

    Written independently of `format.Qwen3.assemble` (segment by segment, not one text), so an
    emulator built on it checks reconstruction rather than agreeing with it by construction.
    """
    ids: list[int] = []
    text = ""
    if reasoning is not None:
        ids.append(tok.token_id(THINK))
        ids.extend(tok.encode_ordinary("\n" + reasoning + "\n"))
        ids.append(tok.token_id(THINK_END))
        text = "\n\n"
    text += content
    for k, (name, arguments) in enumerate(calls):
        if k or content:
            text += "\n"
        if text:
            ids.extend(tok.encode_ordinary(text))
        ids.append(tok.token_id(TOOL_CALL))
        ids.extend(tok.encode_ordinary(f'\n{{"name": "{name}", "arguments": {arguments}}}\n'))
        ids.append(tok.token_id(TOOL_CALL_END))
        text = ""
    if text:
        ids.extend(tok.encode_ordinary(text))
    if stop:
        ids.append(tok.token_id(IM_END))
    return ids

"""What an SGLang server (`--reasoning-parser qwen3 --tool-call-parser qwen25`) makes of a
Qwen3 request and completion (the emulator's `sglang` profile), plain and streamed: a
re-statement, in our own code, of the upstream behaviour described in docs/qwen3.md
("SGLang", "Stream"), which names the upstream files and functions each rule comes from.

This module depends on nothing in `specregen.emulator`; the emulator wires it in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.qwen3.render import render_with_template, template_text
from specregen.models.qwen3.servers import RequestError, parses_tools, template_kwargs
from specregen.models.qwen3.tokens import (
    ENDOFTEXT,
    IM_END,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
)
from specregen.models.serverkit.partial_json import PartialJSONError, partial_loads
from specregen.models.serverkit.stream import (
    Delta,
    Output,
    Parsed,
    ServerCall,
    common_prefix,
    ends_with_partial,
    is_complete_json,
)
from specregen.models.tokenizer import Tokenizer

CALL_OPEN = TOOL_CALL + "\n"  # `Qwen25Detector.bot_token`
CALL_CLOSE = "\n" + TOOL_CALL_END  # `Qwen25Detector.eot_token`
_BLOCK = re.compile(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


def server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
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
                    args = _history_arguments(i, j, args)
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


def _history_arguments(i: int, j: int, arguments: str) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        raise RequestError(f"{where}: must be valid JSON") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"{where}: must be a JSON object")
    return parsed


def render_prompt_text(request: dict[str, Any], template: str | None = None) -> str:
    """The prompt SGLang renders: its message handling, tools left out when `tool_choice` is
    "none", the template through transformers with the request's `enable_thinking`."""
    tools = request.get("tools") or None
    if request.get("tool_choice") == "none":
        tools = None
    return render_with_template(
        template if template is not None else template_text(),
        server_messages(request["messages"]), tools,
        enable_thinking=template_kwargs(request).get("enable_thinking"))


def encode_prompt(request: dict[str, Any], tok: Tokenizer, template: str | None = None
                         ) -> list[int]:
    return tok.encode_with_specials(render_prompt_text(request, template))


def forces_reasoning(request: dict[str, Any]) -> bool:
    """`serving_chat._get_reasoning_from_request` for the qwen3 parser (`reasoning_default =
    "enable_thinking"`): forced unless the request sets `enable_thinking` to false."""
    return template_kwargs(request).get("enable_thinking") is not False


def split_reasoning(text: str, forced: bool) -> tuple[str, str]:
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
    at = text.find(CALL_OPEN)
    if at == -1:
        return False, (), text
    normal = text[:at].strip()
    calls: list[ServerCall] = []
    for match in _BLOCK.finditer(text):
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


def parse(out: Output, request: dict[str, Any]) -> Parsed:
    """The fields a non-streamed SGLang answer carries (`_build_chat_response`): reasoning
    (`reasoning_content`, None when empty), content ("" rather than null), calls, finish."""
    reasoning, text = split_reasoning(out.text, forces_reasoning(request))
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


def decode_output(ids: Sequence[int], tok: Tokenizer, truncated: bool) -> Output:
    """SGLang's `DetokenizerManager` (incremental decode, one chunk per step): the tokens
    since the last committed text are decoded together; while that ends in U+FFFD nothing is
    committed and the chunk shows only its `find_printable_text` part; the finishing step shows
    everything, an unfinished character as U+FFFD included (no hold-back at the end). The stop
    token is cut from the ids before decoding (`trim_matched_stop`). Each delta is what the
    serving layer adds to its stream buffer (`text[len(stream_buffer):]`); the last delta is
    the finishing step's (the stop token's, "" text, when there is one)."""
    stops = (tok.token_id(IM_END), tok.token_id(ENDOFTEXT))
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


class _ReasoningStream:
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
            elif (k := ends_with_partial(self.normal_buffer, end)):
                normal, self.normal_buffer = self.normal_buffer[:-k], self.normal_buffer[-k:]
            else:
                normal, self.normal_buffer = self.normal_buffer, ""
        return normal, items

    def _base(self, new_text: str) -> tuple[str, list[_CallItem]]:
        """`BaseFormatDetector.parse_streaming_increment`."""
        self.buffer += new_text
        text = self.buffer
        bot, eot, sep = CALL_OPEN, CALL_CLOSE, "\n"
        # `has_tool_call` (`<tool_call>\n` anywhere in the buffer), or the separator opening the
        # buffer once a call is done: the latter keeps every "\n" after a call -- and all text
        # after the calls -- in the buffer, never sent.
        if not (bot in text or (self.current > 0 and text.startswith(sep))):
            if ends_with_partial(text, bot):
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
            obj, end = partial_loads(text[start:], allow_str=self.name_sent)
        except (PartialJSONError, RecursionError):
            return "", []
        if not isinstance(obj, dict):
            return "", []  # upstream fails on `.get` and logs: an empty result
        complete = is_complete_json(text[start:start + end])
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
                diff = common_prefix(prev_json, cur)[sent:]
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


def stream(out: Output, request: dict[str, Any]) -> StreamParsed:
    """`_generate_chat_stream`, chunk by chunk (one per decode step, `out` from
    `decode_output`): the reasoning parser on each delta, then -- with tools -- the
    qwen25 detector on its normal text (also on empty deltas), call items as they come, and at
    the finishing chunk the unstreamed-arguments top-up. Finish: `tool_calls` when any call
    item was sent and the engine stopped on a stop token."""
    reasoning_parser = _ReasoningStream(forces_reasoning(request))
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

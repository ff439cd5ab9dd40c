"""What a vLLM server before 0.32 (`--reasoning-parser qwen3 --tool-call-parser hermes`) makes
of a Qwen3 request and completion (the emulator's `openrouter` profile: vLLM behind the
router): a re-statement, in our own code, of the upstream behaviour described in
docs/qwen3.md, which names the upstream files and functions each rule comes from. vLLM
0.32's is `vllm.py`; SGLang's `sglang.py`.

The parsers see the completion as the detokenizer gives it: the stop token (`<|im_end|>` or
`<|endoftext|>`) is not in the text; `<think>`, `</think>`, `<tool_call>`, `</tool_call>` are
(added, not special), so a marker the model wrote as plain characters looks exactly like the
real token to every string rule. The streaming paths also see each step's token ids.

This module depends on nothing in `specregen.emulator`; the emulator wires it in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.qwen3.hermes import ARGS, CALL_BLOCK, HermesStream
from specregen.models.qwen3.render import render_with_template, template_text
from specregen.models.qwen3.servers import parses_tools, server_messages, template_kwargs
from specregen.models.qwen3.tokens import (
    ENDOFTEXT,
    IM_END,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
)
from specregen.models.serverkit.stream import Delta, Output, Parsed, ServerCall
from specregen.models.tokenizer import Tokenizer


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


def parser_thinking(request: dict[str, Any]) -> bool:
    """Thinking as the qwen3 reasoning parser reads it: `enable_thinking`, default on; any
    falsy value turns it off (the template only reacts to exactly `false`)."""
    return bool(template_kwargs(request).get("enable_thinking", True))



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


# -- hermes tool parser (its stream: hermes.py) --------------------------------------------------


def hermes_extract(text: str) -> tuple[bool, tuple[ServerCall, ...], str | None]:
    """`Hermes2ProToolParser.extract_tool_calls`: (tools_called, calls, content). One failing
    block (bad JSON, no name or arguments) makes the whole text content again."""
    if TOOL_CALL not in text:
        return False, (), text
    try:
        calls = []
        for k, match in enumerate(CALL_BLOCK.finditer(text)):
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


def _tool_args(tc_json: str, complete: bool) -> str | None:
    """The arguments value by brace matching (strings respected); a scalar value loses a
    trailing `}` once complete; an unbalanced value is returned as it is."""
    match = ARGS.search(tc_json)
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
    content, calls = HermesStream(_tool_args).run(content_steps)
    if calls and not out.truncated:
        finish = "tool_calls"
    return Parsed("".join(reasoning) if reasoning else None, content or None, calls, finish)



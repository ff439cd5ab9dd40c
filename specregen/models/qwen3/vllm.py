"""What vLLM 0.32 (`--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser
qwen3`, a fast tokenizer) makes of a Qwen3 request and of the ids the model wrote: our own
restatement of docs/vllm-0.32.md section (B), held against the real server by
bench/real_vllm.py (the emulator profile `vllm-hermes`).

How 0.32 is put together, and why the restatement has the shape it has:

* The parser is a `DelegatingParser` over two parts: the `qwen3` reasoning parser, an adapter
  around the parser engine (`Qwen3Parser`, run with tool parsing switched off), and the old
  string-based `Hermes2ProToolParser`. Hermes is not engine-based, so hermes always sees the
  raw content text; only the reasoning pass is the engine's.
* The engine matches its terminals by text when it is fed text alone (every non-streamed
  parse) and by token id once ids come with the text (the stream, and the plain answer's
  `reasoning_tokens` count, which parses the ids again). So a marker the model spelled in
  ordinary tokens acts as the marker in a plain answer and stays text in a stream.
* Every special token of the tokenizer that is not a terminal is a drop terminal: its literal
  text (text mode) or its id (id mode) is deleted wherever the engine runs.
* The serving layer adds its own rules: content null or "", `finish_reason`, the stream's
  prompt check, the usage count.

Only the parts that change what a client receives are restated; the engine's lexer hold-back
and chunking change how a stream is cut into chunks, never what it adds up to.

The request side (`render_prompt_text`) restates 0.32's message preprocessing and tool dump.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specregen.models.qwen3.hermes import ARGS, CALL_BLOCK, HermesStream
from specregen.models.qwen3.render import render_with_template, template_text
from specregen.models.qwen3.servers import RequestError
from specregen.models.qwen3.tokens import (
    ADDED_TOKENS,
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
)
from specregen.models.serverkit.stream import Output, Parsed, ServerCall
from specregen.models.tokenizer import Tokenizer

# `ChatCompletionRequest.reasoning_effort` (any other value is a 400).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

# ---------------------------------------------------------------------------------------------
# Request side


def template_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    """The chat-template kwargs the server uses for this request (`build_chat_params`): the
    request's `chat_template_kwargs`, with `enable_thinking` derived from `reasoning_effort`
    (`"none"` is off, any other effort on) when the request's kwargs do not have the key.
    The parser is built with the same kwargs, so this one switch drives the template and the
    parser alike."""
    kwargs = request.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object")
    effort = request.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise RequestError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs = {**kwargs, "enable_thinking": effort != "none"}
    return kwargs


def parser_thinking(request: dict[str, Any]) -> bool:
    """`Qwen3Parser.thinking_enabled`: `enable_thinking`, default on; any falsy value (also
    null) is off. (The template reacts only to exactly `false`.)"""
    return bool(template_kwargs(request).get("enable_thinking", True))


def tool_choice(request: dict[str, Any]) -> Any:
    """`tool_choice` after validation: `auto` when tools are sent and no choice is, else
    `none` when none is."""
    choice = request.get("tool_choice")
    if choice is None:
        return "auto" if request.get("tools") else "none"
    return choice


def named_choice(request: dict[str, Any]) -> bool:
    return isinstance(tool_choice(request), dict)


def runs_hermes(request: dict[str, Any]) -> bool:
    """Hermes reads the content when tools were sent and the choice is not `none`. With
    `VLLM_ENFORCE_STRICT_TOOL_CALLING` on (the default) `required` and named choices are read
    from the native format like `auto` (the structural tag that constrains decoding is not the
    parser's business)."""
    return bool(request.get("tools")) and tool_choice(request) != "none"


def server_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The tools as the template gets them: each request tool's `model_dump()`. Fixed key
    order; a missing `description` or `parameters` is null; unknown keys are dropped;
    `strict` and `defer_loading` only when set (a top-level `defer_loading` is copied into
    the function when that has none)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise RequestError(f"tools[{i}] must be a function tool")
        if not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}].function.name must be a string")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise RequestError(f"tools[{i}].function.description must be a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise RequestError(f"tools[{i}].function.parameters must be an object")
        dumped_fn: dict[str, Any] = {"name": fn["name"], "description": fn.get("description"),
                                     "parameters": fn.get("parameters")}
        if fn.get("strict") is not None:
            dumped_fn["strict"] = fn["strict"]
        defer = fn.get("defer_loading")
        if defer is None:
            defer = tool.get("defer_loading")
        if defer is not None:
            dumped_fn["defer_loading"] = defer
        dumped: dict[str, Any] = {"type": "function", "function": dumped_fn}
        if tool.get("defer_loading") is not None:
            dumped["defer_loading"] = tool["defer_loading"]
        out.append(dumped)
    return out


def server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts 0.32 hands to the template (`_parse_chat_message_content`,
    `_postprocess_messages`, the request validator's renaming):

    * content: null is `""`, a string stays, text parts are joined with `"\\n"` (the Qwen3
      template is string-content; other part types are not restated: a 400 here);
    * an assistant turn's reasoning is `reasoning`, or `reasoning_content` when `reasoning` is
      absent or null, passed under both names (the template reads `reasoning_content`);
    * history `arguments`: an object stays, a string is parsed; invalid JSON, JSON that is not
      an object, a non-string value, or nothing all become `{}` (no 400: a broken turn in the
      history would otherwise fail every later turn); an empty `tool_calls` list is removed;
      an entry that is not a function call is a 400.
    """
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object")
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if isinstance(part, str):
                    texts.append(part)
                elif isinstance(part, dict) and part.get("type") == "text":
                    texts.append(part.get("text") or "")
                else:
                    raise RequestError(f"messages[{i}].content[{j}]: only text parts are "
                                       "supported for Qwen3")
            content = "\n".join(texts)
        new: dict[str, Any] = {"role": role, "content": "" if content is None else content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                new["tool_calls"] = [_history_call(i, j, c) for j, c in enumerate(calls)]
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
    return out


def _history_call(i: int, j: int, call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise RequestError(f"messages[{i}].tool_calls[{j}] must be an object")
    fn = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(fn, dict):
        raise RequestError(f"messages[{i}].tool_calls[{j}]: only function calls are supported")
    call = copy.deepcopy(call)
    fn = call["function"]
    args = fn.get("arguments")
    parsed: Any = {}
    if isinstance(args, dict):
        parsed = args
    elif isinstance(args, str) and args:
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            parsed = {}
    fn["arguments"] = parsed if isinstance(parsed, dict) else {}
    return call


def render_prompt_text(request: dict[str, Any], template: str | None = None) -> str:
    """The prompt 0.32 renders: its message preprocessing, the tools' dump, the template
    through transformers with the effective `enable_thinking`."""
    kwargs = template_kwargs(request)
    return render_with_template(
        template if template is not None else template_text(),
        server_messages(request["messages"]),
        server_tools(request.get("tools")),
        enable_thinking=kwargs.get("enable_thinking"),
    )


def encode_prompt(request: dict[str, Any], tok: Tokenizer, template: str | None = None
                  ) -> list[int]:
    """`tokenizer(prompt, add_special_tokens=False)`: special-token strings become ids."""
    return tok.encode_with_specials(render_prompt_text(request, template))


# ---------------------------------------------------------------------------------------------
# The parser's vocabulary


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The ids and strings 0.32's Qwen3 parsers match.

    `drops`: every special token of the tokenizer that is not a terminal (`<|im_end|>`,
    `<|endoftext|>`, `<|im_start|>`, the vision and box tokens): the engine deletes them.
    `<tool_call>`/`</tool_call>`/`<think>`/`</think>` are terminals, matched by id in id mode.
    """

    think: int
    think_end: int
    tool_call: int
    tool_call_end: int
    drops: dict[int, str]
    boundaries: frozenset[int]  # turn boundaries for the prompt check
    tok: Tokenizer = field(compare=False, repr=False)

    @classmethod
    def of(cls, tok: Tokenizer) -> Vocabulary:
        drops = {token_id: name for token_id, name, special in ADDED_TOKENS
                 if special and tok.added_tokens.get(name) == token_id}
        return cls(tok.token_id(THINK), tok.token_id(THINK_END), tok.token_id(TOOL_CALL),
                   tok.token_id(TOOL_CALL_END), drops,
                   frozenset((tok.token_id(IM_START), tok.token_id(IM_END))), tok)

    def terminal_ids(self) -> frozenset[int]:
        """Ids the engine sees as markers, never as text tokens (not counted as reasoning)."""
        return frozenset((self.think, self.think_end, self.tool_call, self.tool_call_end,
                          *self.drops))


@dataclass(frozen=True, slots=True)
class Answer:
    """The fields 0.32 returns and the usage's `reasoning_tokens`."""

    parsed: Parsed
    reasoning_tokens: int


def parse(out: Output, ids: Sequence[int], request: dict[str, Any], vocab: Vocabulary, *,
          stream: bool, prompt_ids: Sequence[int] = ()) -> Answer:
    """What 0.32 returns for the detokenized `out` of `ids` (all generated ids, the stop
    token included when there is one). The stream also needs the prompt ids."""
    if stream:
        return _stream(out, ids, request, vocab, prompt_ids)
    return _plain(out, ids, request, vocab)


# ---------------------------------------------------------------------------------------------
# The reasoning pass, text mode (every non-streamed answer)


@functools.lru_cache(maxsize=8)
def _literal_pattern(drops: frozenset[str]) -> re.Pattern[str]:
    # The engine's lexer takes the longest terminal at the leftmost place it can; no terminal
    # holds another's first character past its own start, so one alternation, longest first,
    # finds the same pieces. Terminals that never change the text in CONTENT/REASONING
    # (`</tool_call>`, `<function=`, `>`, ...) are left out: they are passed through as text.
    literals = sorted({THINK, THINK_END, TOOL_CALL, *drops}, key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in literals))


def split_reasoning(text: str, vocab: Vocabulary) -> tuple[str | None, str | None]:
    """`Qwen3Parser.extract_reasoning` with thinking on, tool parsing off, text mode:

    * the text starts as reasoning, including any text before a `<think>`; `<think>` strings
      in the reasoning vanish;
    * the first `</think>` ends it; so does a `<tool_call>`, which stays in the content for
      hermes (an unclosed think block holding a call still yields the call);
    * later `</think>` strings are removed from the content;
    * drop strings (`<|im_end|>`, `<|im_start|>`, ...) are removed everywhere;
    * no trimming; empty is null.
    """
    reasoning: list[str] = []
    content: list[str] = []
    in_reasoning = True
    pos = 0
    drops = frozenset(vocab.drops.values())
    for match in _literal_pattern(drops).finditer(text):
        (reasoning if in_reasoning else content).append(text[pos:match.start()])
        pos = match.end()
        literal = match.group()
        if literal in drops:
            continue
        if in_reasoning:
            if literal == THINK_END:
                in_reasoning = False
            elif literal == TOOL_CALL:
                in_reasoning = False
                content.append(literal)
            # <think>: removed
        elif literal != THINK_END:  # a later </think> is removed; <think>, <tool_call> stay
            content.append(literal)
    (reasoning if in_reasoning else content).append(text[pos:])
    return "".join(reasoning) or None, "".join(content) or None


def count_reasoning_tokens(ids: Sequence[int], vocab: Vocabulary, thinking: bool) -> int:
    """`count_reasoning_tokens` of a non-streamed answer: a fresh engine parses the decoded
    text again with the ids (id mode, tool parsing on) and counts the text tokens that went
    into reasoning. With thinking on, reasoning runs up to the first `</think>` or
    `<tool_call>` id; marker and drop ids are no text tokens; a token counts even when its own
    decode is an unfinished character.

    The ids between two marker ids form a group, counted as a whole with the text the engine
    places before the marker. The engine places it by matching the markers' texts in the
    decoded text; when the tokens, decoded one by one, do not join up to that text (a split
    character), it binds each marker, right to left, to the last occurrence of its text before
    the next marker's (`TokenIDScanner._rebuild_from_anchors`). A marker string the model also
    spelled in ordinary tokens can then capture the marker, and a group left with no text
    between two markers is lost from the count."""
    if not thinking:
        return 0
    markers = vocab.terminal_ids()
    anchors = [token_id for token_id in ids if token_id in markers]
    groups = [0]
    for token_id in ids:
        if token_id in markers:
            groups.append(0)
        else:
            groups[-1] += 1
    ends = [k for k, a in enumerate(anchors) if a in (vocab.think_end, vocab.tool_call)]
    last = ends[0] if ends else len(anchors)  # groups 0..last are in the reasoning
    kept = [True] * len(groups)
    tok = vocab.tok
    text = tok.decode(list(ids))
    pieces = "".join(tok.decode([token_id]) for token_id in ids)
    if anchors and pieces not in text:
        literals = [tok.decode([a]) for a in anchors]
        positions = [0] * len(anchors)
        bound = len(text)
        for k in range(len(anchors) - 1, -1, -1):
            # Every marker's text is in the decoded text, at or after its own place, so each
            # one is found before the next one's binding (never -1 here).
            positions[k] = bound = text.rfind(literals[k], 0, max(bound, 0))
        consumed = 0
        for k, pos in enumerate(positions):
            kept[k] = pos > consumed
            consumed = pos + len(literals[k])
        kept[-1] = consumed < len(text)
    return sum(n for k, n in enumerate(groups[:last + 1]) if kept[k])


# ---------------------------------------------------------------------------------------------
# Hermes


def hermes_extract(text: str) -> tuple[bool, tuple[ServerCall, ...], str | None]:
    """`Hermes2ProToolParser.extract_tool_calls`: (tools_called, calls, content).

    Triggered by the string `<tool_call>`; each block (closed, or the rest of the text) is
    `json.loads`ed and must be an object with a string `name` and an `arguments` key; the
    arguments are `json.dumps(..., ensure_ascii=False)` of the value (the model's spacing and
    escapes are lost). One failing block fails them all: no calls, the text stays content.
    Content: the text before the first `<tool_call>`, null when empty."""
    if TOOL_CALL not in text:
        return False, (), text
    calls = []
    for k, match in enumerate(CALL_BLOCK.finditer(text)):
        body = match.group(1) or match.group(2) or ""
        try:
            value = json.loads(body)
            name, arguments = value["name"], value["arguments"]
        except (ValueError, KeyError, TypeError, IndexError):
            return False, (), text
        if not isinstance(name, str):  # `FunctionCall.name` is a str field: a 400-free failure
            return False, (), text
        calls.append(ServerCall(name, json.dumps(arguments, ensure_ascii=False), k))
    content = text[: text.find(TOOL_CALL)]
    return True, tuple(calls), content or None


def _stream_args(body: str, complete: bool) -> str | None:
    """0.32's `_extract_tool_args`: everything after the first `"arguments":` -- no brace
    matching, so keys after `arguments` (and a `name` written after it) are part of it; once
    the body is complete, the outer object's last `}` is cut off (with the whitespace around
    it)."""
    match = ARGS.search(body)
    if match is None:
        return None
    raw = body[match.end():]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw


# ---------------------------------------------------------------------------------------------
# The non-streamed answer


def _plain(out: Output, ids: Sequence[int], request: dict[str, Any], vocab: Vocabulary
           ) -> Answer:
    thinking = parser_thinking(request)
    if thinking:
        reasoning, content = split_reasoning(out.text, vocab)
    else:
        # `Qwen3Parser.extract_reasoning` returns the text untouched: no engine, no drops,
        # and an empty text stays "" (not null).
        reasoning, content = None, out.text
    finish = "length" if out.truncated else "stop"
    count = count_reasoning_tokens(ids, vocab, thinking)
    choice = tool_choice(request)
    forced = choice == "required" or named_choice(request)
    calls: tuple[ServerCall, ...] = ()
    if runs_hermes(request):
        called, found, rest = hermes_extract(content if content is not None else "")
        if called:
            calls = found
            content = rest if rest is not None and rest.strip() else None
        elif forced and (content is None or not content.strip()):
            content = None
    if request.get("parallel_tool_calls") is False:
        calls = calls[:1]
    if forced:
        # The required/named branch of the full generator: content is never null.
        content = content or ""
        if choice == "required" and not out.truncated:
            finish = "tool_calls"  # on a stop-token finish, even with no call
    elif calls:
        finish = "tool_calls"  # also after a length stop
    return Answer(Parsed(reasoning, content, calls, finish), count)


# ---------------------------------------------------------------------------------------------
# The stream


def prompt_ends_reasoning(prompt_ids: Sequence[int], vocab: Vocabulary, thinking: bool
                          ) -> bool:
    """The engine's `is_reasoning_end` on the prompt: scanning back, `</think>` or
    `<tool_call>` first means ended; `<think>` first means open (thinking on; with thinking off
    `<think>` opens nothing and ends the scan); a turn boundary (`<|im_start|>`, `<|im_end|>`)
    ends the scan. An ended scan means ended only with thinking off. So a thinking-on prompt,
    which ends `<|im_start|>assistant\\n`, is never "ended" -- also in a tool loop whose
    earlier turn kept its `</think>` -- and a thinking-off prompt always is."""
    for token_id in reversed(prompt_ids):
        if token_id in (vocab.think_end, vocab.tool_call):
            return True
        if token_id == vocab.think:
            if thinking:
                return False
            break
        if token_id in vocab.boundaries:
            break
    return not thinking


@dataclass(frozen=True, slots=True)
class _ReasoningStep:
    reasoning: str
    content: str
    ended: bool
    counted: bool  # a text token the engine counts as reasoning


def _reasoning_step(text: str, token_id: int, vocab: Vocabulary, markers: frozenset[int],
                    marker_text: dict[int, str]) -> _ReasoningStep:
    """One decode step through the reasoning engine in id mode (tool parsing off), still in
    the reasoning. Markers count by id only: the same strings spelled in ordinary tokens are
    reasoning text. Text the detokenizer held before a marker belongs to the reasoning."""
    if token_id not in markers:
        # A step whose text the detokenizer held (an unfinished character) adds nothing and
        # is never counted, also when its text comes out with the next step.
        return _ReasoningStep(text, "", False, bool(text))
    literal = marker_text[token_id]
    head = text[: text.rfind(literal)] if literal in text else text
    if token_id == vocab.think_end:
        return _ReasoningStep(head, "", True, False)
    if token_id == vocab.tool_call:
        # An implicit end: the tag goes on to hermes as content.
        return _ReasoningStep(head, literal, True, False)
    if token_id == vocab.tool_call_end:
        return _ReasoningStep(text, "", False, False)  # no transition: text, not counted
    return _ReasoningStep(head, "", False, False)  # <think> and drop ids: removed


def _stream(out: Output, ids: Sequence[int], request: dict[str, Any], vocab: Vocabulary,
            prompt_ids: Sequence[int]) -> Answer:
    """What the stream adds up to (`DelegatingParser.parse_delta`, one decode step at a time).

    Reasoning phase (unless the prompt check says ended): the reasoning engine on each step,
    by id, until `</think>` or `<tool_call>` ends it. Then the tool phase on the text from
    there on: hermes on the whole content text when it runs, else each step's text as it is --
    neither removes a later `</think>` or a special token's text (the engine is not used
    again). `reasoning_tokens` is the streaming engine's count; a stream that never entered the
    reasoning phase counts by parsing the ids again, as a plain answer does."""
    thinking = parser_thinking(request)
    ended = prompt_ends_reasoning(prompt_ids, vocab, thinking)
    entered = not ended
    markers = vocab.terminal_ids()
    marker_text = {vocab.think: THINK, vocab.think_end: THINK_END, vocab.tool_call: TOOL_CALL,
                   vocab.tool_call_end: TOOL_CALL_END, **vocab.drops}
    reasoning: list[str] = []
    count = 0
    tail: list[str] = []  # the content text, step by step
    for delta in out.deltas:
        if ended:
            tail.append(delta.text)
            continue
        step = _reasoning_step(delta.text, delta.token_id, vocab, markers, marker_text)
        reasoning.append(step.reasoning)
        count += step.counted
        if step.ended:
            ended = True
            tail.append(step.content)
    if not entered:
        count = count_reasoning_tokens(ids, vocab, thinking)
    finish = "length" if out.truncated else "stop"
    calls: tuple[ServerCall, ...] = ()
    if runs_hermes(request):
        content, calls = HermesStream(_stream_args, top_up=True).run(tail)
    else:
        content = "".join(tail)
    if request.get("parallel_tool_calls") is False:
        calls = calls[:1]
    if calls and not out.truncated and not named_choice(request):
        finish = "tool_calls"
    # The role chunk always carries `content: ""`: a stream's content is never null.
    return Answer(Parsed("".join(reasoning) or None, content, calls, finish), count)

"""Kimi K3's prompt rendering, as segments: our own code, written from docs/kimi-k3.md (§2).

K3 ships no Jinja template. Its tokenizer renders a conversation in Python into a list of
segments `(text, marker)`; each segment is tokenized on its own, a marker segment as its one
special id (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) and every other segment as
ordinary BPE text in which special-token strings are plain characters. BPE and the
pre-tokenizer therefore never cross a segment boundary: a tag name, an attribute's ` key`,
its `="`, its value and its closing `"` are each their own piece.

Grammar (§2.1):

    open(tag, attrs)   = <|open|> tag ( " key" '="' escaped(value) '"' )* <|sep|>
    close(tag)         = <|close|> tag <|sep|>
    message(attrs, B)  = open(message, attrs) B close(message) <|end_of_msg|>

This module is self-contained (standard library only): the real-vLLM harness copies it into
the model folder as `encoding_k3.py`, where our tokenizer class (`hf_tokenizer.py`) renders
the server's prompts with it. `revision` chooses between the two model-repo revisions that
differ on inputs a vLLM 0.32 server can send (§5 #1): "r3" (the default; the newer) renders
whitespace-only history reasoning and refuses unknown roles, "r2" leaves such reasoning out
and skips unknown roles.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

OPEN = "<|open|>"
CLOSE = "<|close|>"
SEP = "<|sep|>"
END_OF_MSG = "<|end_of_msg|>"
MARKERS = (OPEN, CLOSE, SEP, END_OF_MSG)

# (text, marker): a marker segment is one special id, anything else ordinary text.
Segment = tuple[str, bool]

THINKING_EFFORTS = ("low", "high", "max")
DEFAULT_THINKING_EFFORT = "max"
REVISIONS = ("r3", "r2")

TOOLS_INTRO = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
DYNAMIC_TOOLS_INTRO = (
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n")
TOOLS_OUTRO = "\n```"
EFFORT_TEXT = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the"
    " response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={effort}`.")
TOOL_CHOICE_TEXT = {
    "required": "The system is invoked with `tool_choice=required`.\n"
                "You MUST call tools in the next message.",
    "none": "The system is invoked with `tool_choice=none`.\n"
            "You MUST NOT call any tools in the next message.",
}
JSON_OBJECT_TEXT = (
    "The system is invoked with `response_format=json_object`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) or any "
    "additional formatting.")
JSON_SCHEMA_TEXT = (
    "The system is invoked with `response_format=json_schema`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) or any "
    "additional formatting.\nThe JSON data must match the following schema:\n```json\n")


class EncodingError(ValueError):
    """A conversation the K3 encoder cannot render (the server answers 400)."""


# ---------------------------------------------------------------------------------------------
# Pieces


def text(value: Any) -> list[Segment]:
    """An ordinary-text segment; an empty text is no segment at all."""
    value = str(value)
    return [(value, False)] if value else []


def marker(name: str) -> list[Segment]:
    return [(name, True)]


def escape(value: Any) -> str:
    """An attribute value: `&` first, then `"`; `<` and `>` stay as they are."""
    return str(value).replace("&", "&amp;").replace('"', "&quot;")


def open_tag(tag: str, attrs: Iterable[tuple[str, Any]] = ()) -> list[Segment]:
    out = marker(OPEN) + text(tag)
    for key, value in attrs:
        # Four pieces per attribute: ` key`, `="`, the escaped value (none when empty), `"`.
        out += text(" " + key) + text('="') + text(escape(value)) + text('"')
    return out + marker(SEP)


def close_tag(tag: str) -> list[Segment]:
    return marker(CLOSE) + text(tag) + marker(SEP)


def message(attrs: Sequence[tuple[str, Any]], body: list[Segment]) -> list[Segment]:
    return open_tag("message", attrs) + body + close_tag("message") + marker(END_OF_MSG)


def deep_sorted(value: Any) -> Any:
    """Every dict's keys sorted, recursively; lists keep their order."""
    if isinstance(value, dict):
        return {k: deep_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(v) for v in value]
    return value


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def argument_type(value: Any) -> str:
    """The `type` attribute of an argument: the JSON type of its value, numbers as `number`
    (a bool is checked before the numbers it also is in Python)."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array"


def argument_text(value: Any) -> str:
    """An argument's body: a string as it is (not escaped, not quoted), anything else
    `json.dumps` with its default separators."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_segments(name: str, index: int, arguments: dict[str, Any]) -> list[Segment]:
    out = open_tag("call", (("tool", name), ("index", index)))
    for key, value in arguments.items():
        out += open_tag("argument", (("key", key), ("type", argument_type(value))))
        out += text(argument_text(value))
        out += close_tag("argument")
    return out + close_tag("call")


def tools_segments(calls: Sequence[tuple[str, dict[str, Any]]]) -> list[Segment]:
    out = open_tag("tools")
    for k, (name, arguments) in enumerate(calls, start=1):
        out += call_segments(name, k, arguments)
    return out + close_tag("tools")


def joined(segments: Iterable[Segment]) -> str:
    """The rendered text (markers as their strings): what a detokenizer shows."""
    return "".join(s for s, _ in segments)


# ---------------------------------------------------------------------------------------------
# Messages


def _content(content: Any) -> list[Segment]:
    if content is None:
        return []
    if isinstance(content, str):
        return text(content)
    if isinstance(content, list):
        out: list[Segment] = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                out += text(part.get("text") or "")
            else:
                raise EncodingError(f"content part of type {kind!r} is not supported "
                                    "(images are out of scope)")
        return out
    raise EncodingError(f"message content must be a string or a list, not "
                        f"{type(content).__name__}")


def call_arguments(arguments: Any) -> dict[str, Any]:
    """A history call's arguments as the encoder reads them: a dict as it is; a JSON object
    string parsed (vLLM 0.32 always hands dicts, so the string forms only matter offline);
    empty or missing: no arguments."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise EncodingError(f"tool call arguments are not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise EncodingError("Kimi K3 tool call arguments must be a JSON object")
        return parsed
    raise EncodingError(f"tool call arguments must be an object, not {type(arguments).__name__}")


def reasoning_of(message: dict[str, Any]) -> Any:
    return message.get("reasoning_content") or message.get("reasoning")


def assistant_body(message: dict[str, Any], *, thinking: bool,
                   revision: str = "r3") -> list[Segment]:
    """An assistant message's body (§2.3): the think channel when thinking (always, even
    empty), the response channel (always), the tools channel when it has calls."""
    out: list[Segment] = []
    if thinking:
        reasoning = reasoning_of(message)
        out += open_tag("think")
        if reasoning is not None and (str(reasoning).strip() if revision == "r2"
                                      else str(reasoning)):
            out += text(reasoning)
        out += close_tag("think")
    out += open_tag("response") + _content(message.get("content")) + close_tag("response")
    calls = message.get("tool_calls")
    if calls:
        rendered = []
        for call in calls:
            fn = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise EncodingError("a history tool call has no function name")
            rendered.append((fn["name"], call_arguments(fn.get("arguments"))))
        out += tools_segments(rendered)
    return out


def _call_index(calls: Any) -> dict[str, tuple[int, str | None]]:
    """Call id -> (1-based position, function name); the first occurrence of an id wins."""
    found: dict[str, tuple[int, str | None]] = {}
    for position, call in enumerate(calls or (), start=1):
        if not isinstance(call, dict) or call.get("id") is None:
            continue
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, dict) else call.get("name")
        found.setdefault(str(call["id"]), (position, name))
    return found


def order_tool_results(messages: Sequence[Any]) -> list[Any]:
    """Each run of tool messages put in the order of the last assistant's calls (§2.4), when
    every message of the run names one of its call ids (`tool_call_id`, else `id`); the
    matched call's function name becomes the message's `tool` (and `name`, when it has
    one). A run with an unmatched message stays as it came. Messages are copied, not
    changed."""
    out: list[Any] = []
    calls: dict[str, tuple[int, str | None]] = {}
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role") if isinstance(m, dict) else None
        if role == "assistant":
            calls = _call_index(m.get("tool_calls"))
        if role != "tool":
            out.append(m)
            i += 1
            continue
        run: list[tuple[int | None, int, Any, str | None]] = []
        while i < len(messages) and isinstance(messages[i], dict) \
                and messages[i].get("role") == "tool":
            t = messages[i]
            key = t.get("tool_call_id", t.get("id"))
            hit = calls.get(str(key)) if key is not None else None
            run.append((hit[0] if hit else None, len(run), t, hit[1] if hit else None))
            i += 1
        if any(position is None for position, *_ in run):
            out.extend(t for *_, t, _ in run)
            continue
        for _, _, t, name in sorted(run, key=lambda r: (r[0], r[1])):
            if name is None:
                out.append(t)
                continue
            t = dict(t)
            t["tool"] = name
            if "name" in t:
                t["name"] = name
            out.append(t)
    return out


def _internal(kind: str, body: str) -> list[Segment]:
    return message((("role", "system"), ("type", kind)), text(body.strip()))


def tool_declaration(tools: Any, *, dynamic: bool = False) -> list[Segment]:
    body = (DYNAMIC_TOOLS_INTRO if dynamic else TOOLS_INTRO) + compact_json(
        deep_sorted(tools)) + TOOLS_OUTRO
    return message((("role", "system"), ("type", "tool-declare")), text(body))


def response_schema(response_format: Any) -> Any:
    """The schema of a `json_schema` response format: `json_schema.schema`, else
    `json_schema.json_schema` (vLLM's dump), else the `json_schema` object itself."""
    schema = response_format.get("json_schema") if isinstance(response_format, dict) else None
    if not isinstance(schema, dict):
        return schema
    return schema.get("schema", schema.get("json_schema", schema))


def resolve_options(*, thinking: Any = None, enable_thinking: Any = None,
                    reasoning_effort: Any = None, thinking_effort: Any = None
                    ) -> tuple[bool, str]:
    """Thinking and its effort as the hub's encoder settles them: `thinking`, else
    `enable_thinking`, else on; `reasoning_effort` "none" turns it off, another value is the
    effort unless one is given; no effort at all is "max". An unsupported effort is refused
    (even with thinking off)."""
    on = (True if enable_thinking is None else bool(enable_thinking)) if thinking is None \
        else bool(thinking)
    if reasoning_effort == "none":
        on = False
    elif thinking_effort is None and reasoning_effort is not None:
        thinking_effort = reasoning_effort
    if thinking_effort is None:
        thinking_effort = DEFAULT_THINKING_EFFORT
    if thinking_effort not in THINKING_EFFORTS:
        raise EncodingError(f"Kimi K3 supports thinking_effort values: "
                            f"{', '.join(THINKING_EFFORTS)} (got {thinking_effort!r})")
    return on, thinking_effort


def render_segments(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    thinking: bool = True,
    thinking_effort: str | None = DEFAULT_THINKING_EFFORT,
    tool_choice: Any = None,
    response_format: Any = None,
    add_generation_prompt: bool = True,
    revision: str = "r3",
) -> list[Segment]:
    """The prompt as segments (§2.2): the tool declaration, the thinking effort (thinking on
    and an effort set), the messages, the tool choice, the response format, the generation
    prompt."""
    if revision not in REVISIONS:
        raise EncodingError(f"unknown encoder revision {revision!r}")
    out: list[Segment] = []
    if tools:
        out += tool_declaration(tools)
    if thinking and thinking_effort is not None:
        if thinking_effort not in THINKING_EFFORTS:
            raise EncodingError(f"Kimi K3 supports thinking_effort values: "
                                f"{', '.join(THINKING_EFFORTS)} (got {thinking_effort!r})")
        out += _internal("thinking-effort", EFFORT_TEXT.format(effort=thinking_effort))
    calls: Any = None
    tool_count = 0
    for i, m in enumerate(order_tool_results(messages)):
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        named = (("name", m["name"]),) if m.get("name") else ()
        if role == "user" or (role == "system" and not m.get("tools")):
            out += message((("role", role), *named), _content(m.get("content")))
        elif role == "system":
            out += tool_declaration(m["tools"], dynamic=True)
        elif role == "assistant":
            calls = m.get("tool_calls")
            tool_count = 0
            out += message((("role", "assistant"), *named),
                           assistant_body(m, thinking=thinking, revision=revision))
        elif role == "tool":
            tool_count += 1
            name = m["tool"] if "tool" in m else m.get("name")
            if name is None and calls and tool_count <= len(calls):
                call = calls[tool_count - 1]
                fn = call.get("function", call) if isinstance(call, dict) else {}
                name = fn.get("name") if isinstance(fn, dict) else None
            if name is None:
                raise EncodingError(f"messages[{i}]: a tool message needs a tool name (`tool`, "
                                    "`name`, or a call of the last assistant message by order)")
            out += message((("role", "tool"), ("tool", name), ("index", tool_count)),
                           _content(m.get("content")))
        elif revision == "r3":
            raise EncodingError(f"messages[{i}]: role {role!r} is not supported by Kimi K3")
    if isinstance(tool_choice, str) and tool_choice in TOOL_CHOICE_TEXT:
        out += _internal("tool-choice", TOOL_CHOICE_TEXT[tool_choice])
    kind = response_format.get("type") if isinstance(response_format, dict) else response_format
    if kind == "json_object":
        out += _internal("response-format", JSON_OBJECT_TEXT)
    elif kind == "json_schema":
        schema = compact_json(deep_sorted(response_schema(response_format)))
        out += _internal("response-format", JSON_SCHEMA_TEXT + schema + "\n```")
    if add_generation_prompt:
        out += open_tag("message", (("role", "assistant"),))
        out += open_tag("think" if thinking else "response")
    return out


def render_with_options(messages: Sequence[dict[str, Any]],
                        tools: Sequence[dict[str, Any]] | None = None,
                        **kwargs: Any) -> list[Segment]:
    """`render_segments` with the keyword arguments a tokenizer's `apply_chat_template`
    receives (vLLM hands `thinking`, `thinking_effort`, `tool_choice`, `response_format`,
    `add_generation_prompt` and some it does not read); thinking and effort are settled as
    the hub's encoder settles them (`resolve_options`)."""
    thinking, effort = resolve_options(
        thinking=kwargs.get("thinking"), enable_thinking=kwargs.get("enable_thinking"),
        reasoning_effort=kwargs.get("reasoning_effort"),
        thinking_effort=kwargs.get("thinking_effort"))
    return render_segments(
        messages, tools, thinking=thinking, thinking_effort=effort,
        tool_choice=kwargs.get("tool_choice"), response_format=kwargs.get("response_format"),
        add_generation_prompt=kwargs.get("add_generation_prompt", True) is not False,
        revision=kwargs.get("encoder_revision", "r3"))

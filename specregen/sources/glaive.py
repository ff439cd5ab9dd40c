"""glaiveai/glaive-function-calling-v2: rows `{"system", "chat"}` in glaive's own text format.

The conventions and the defect catalogue are in shared/datasets/README.md §2-3. In short:

- `system` is `"SYSTEM: "` + either the no-functions sentence, or the functions lead-in followed
  by pretty-printed JSON function objects (concatenated, not a list), decoded here one by one.
- `chat` is turns tagged `USER: `, `ASSISTANT: `, `FUNCTION RESPONSE: `. A turn boundary is a
  tag at the start of the chat or after a blank line (glaive separates turns with "\\n\\n" or
  "\\n\\n\\n"). A tag after a single newline, or a tag without its space, lies *inside* a turn:
  those are the rows where the source's "AI:" was converted into a stray "ASSISTANT:" (rows 2289,
  9046, 44369), and they are rejected.
- An assistant call is `<functioncall> {"name": "f", "arguments": '<json>'}`: the arguments are
  a single-quoted JSON string inside a JSON-looking object, so the call is not JSON as a whole.

The whole chat is validated even though only the first user turn becomes the prompt, because a
row that is broken later is evidence that its first turns are not what they seem either. With
`turns="all"` the whole chat is the Prompt (`conversation_messages`): calls become assistant
`tool_calls` with synthesized ids `call_{n}`, each FUNCTION RESPONSE a `tool` message answering
the call before it; a call without its response is refused then (nothing could answer the
model's matching call).

Policies beyond the README:

- A function declared twice with *identical* definitions (13 rows upstream) keeps one copy in
  `tools`, without a reject; the dropped names go to `meta["duplicate_functions_dropped"]`. In
  "system_prompt" mode the system text is verbatim and so still shows both copies. Two
  *different* definitions under one name (338 rows) are rejected: a call to it could be held to
  either one.
- Arguments written as a real JSON object instead of a quoted string (rows 111754, 128) are
  unambiguous, so they are accepted as README rule 3(a) does; `accept_object_arguments=False`
  rejects them instead.
- Consecutive same-role turns are allowed (rows 111754, 40468). The reference answer is the
  assistant turn right after the first user turn; it is None when the chat ends on that turn or
  a second USER turn follows, since a later answer replies to more than the prompt holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from specregen.jsonkind import strict_json_loads
from specregen.records import TOOL_MODES, Declaration, Prompt, SourceReject
from specregen.sources._common import (
    RowError,
    arguments_object,
    call_message,
    call_reference,
    check_function_spec,
    check_turns,
    conversation_prompt,
    make_prompt,
    reject,
    require_object,
    require_str,
    require_user_text,
    text_reference,
    type_name,
    wrap_function,
)
from specregen.sources.ids import row_id

SYSTEM_TAG = "SYSTEM: "
FUNCTIONS_LEAD_IN = (
    "You are a helpful assistant with access to the following functions. Use them if required -"
)
NO_FUNCTIONS_SYSTEM = "You are a helpful assistant, with no access to external functions."
# The lead-in as a sentence, for "tools" mode where the functions travel in `tools` instead.
TOOLS_SYSTEM = FUNCTIONS_LEAD_IN.removesuffix(" -") + "."
END_OF_TEXT = "<|endoftext|>"
CALL_TAG = "<functioncall>"

USER, ASSISTANT, FUNCTION_RESPONSE = "USER", "ASSISTANT", "FUNCTION RESPONSE"
_TURN_TAG = re.compile(r"(?:\A|\n{2,})(USER|ASSISTANT|FUNCTION RESPONSE): ")
_STRAY_TAG = re.compile(r"\n[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):")
_QUOTED_CALL_HEAD = re.compile(
    r"""\A\s*\{\s*"name"\s*:\s*"(?P<name>[^"]*)"\s*,\s*"(?P<key>arguments|parameters)"\s*:\s*'"""
)
_QUOTE_CLOSE = re.compile(r"'\s*\}")
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    content: str  # stripped, without the trailing <|endoftext|>
    call: tuple[str, dict[str, Any]] | None = None


def convert(
    row: Any,
    *,
    dataset: str,
    row_label: str,
    tool_mode: Literal["tools", "system_prompt"] = "tools",
    accept_object_arguments: bool = True,
    turns: Literal["first", "all"] = "first",
) -> Prompt | SourceReject:
    """One glaive row as a Prompt of [system, first user turn] (`turns="all"`: the whole
    conversation), or the reason it is refused."""
    if tool_mode not in TOOL_MODES:
        raise ValueError(f"tool_mode must be one of {TOOL_MODES}, got {tool_mode!r}")
    check_turns(turns)
    whole = turns == "all"
    sample_id = row_id(dataset, row)
    try:
        fields = require_object(row)
        system_field = require_str(fields, "system")
        chat = require_str(fields, "chat")
        functions, dropped = parse_system(system_field)
        chat_turns = parse_chat(chat, accept_object_arguments=accept_object_arguments)
        validate_turns(chat_turns, functions)
        if whole:
            system = _system_text(functions, system_field, tool_mode)
            tools = None if functions is None else [wrap_function(spec) for spec in functions]
            meta = _meta(row_label, chat_turns, dropped)
            return conversation_prompt(sample_id, conversation_messages(system, chat_turns),
                                       tools=tools, tool_mode=tool_mode, meta=meta,
                                       declaration=Declaration(tools))
    except RowError as err:
        return reject(sample_id, row_label, str(err))

    meta = _meta(row_label, chat_turns, dropped)
    if functions is None:
        return make_prompt(
            sample_id, NO_FUNCTIONS_SYSTEM, chat_turns[0].content, tool_mode=tool_mode, meta=meta
        )
    system = _system_text(functions, system_field, tool_mode)
    tools = [wrap_function(spec) for spec in functions]
    # In either mode the row declares these: sent as `tools`, or written in the system prompt.
    return make_prompt(
        sample_id, system, chat_turns[0].content, tools=tools, tool_mode=tool_mode, meta=meta,
        declaration=Declaration(tools),
    )


def _meta(row_label: str, turns: list[Turn], dropped: list[str]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "source_row": row_label,
        "reference_first_turn": first_reference(turns),
    }
    if dropped:
        meta["duplicate_functions_dropped"] = dropped
    return meta


def _system_text(functions: list[dict[str, Any]] | None, system_field: str,
                 tool_mode: str) -> str:
    if functions is None:
        return NO_FUNCTIONS_SYSTEM
    return TOOLS_SYSTEM if tool_mode == "tools" else system_field.removeprefix(SYSTEM_TAG)


def conversation_messages(system: str, turns: list[Turn]) -> list[dict[str, Any]]:
    """The whole chat in OpenAI shape: a call becomes an assistant `tool_calls` message with a
    synthesized id, and the FUNCTION RESPONSE after it a `tool` message answering that id."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    calls = 0
    for turn in turns:
        if turn.role == USER:
            messages.append({"role": "user", "content": turn.content})
        elif turn.role == FUNCTION_RESPONSE:
            # validate_turns made sure it answers the call right before it.
            messages.append({"role": "tool", "tool_call_id": f"call_{calls - 1}",
                             "content": turn.content})
        elif turn.call is not None:
            messages.append(call_message([turn.call], calls))
            calls += 1
        else:
            messages.append({"role": "assistant", "content": turn.content})
    return messages


# --- system ---------------------------------------------------------------------------------


def parse_system(system: str) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """The declared functions (None for a no-functions row) and the names of dropped copies."""
    if not system.startswith(SYSTEM_TAG):
        raise RowError(f"system does not start with {SYSTEM_TAG!r}: {system[:60]!r}")
    body = system.removeprefix(SYSTEM_TAG)
    if body.rstrip() == NO_FUNCTIONS_SYSTEM:
        return None, []
    if not body.startswith(FUNCTIONS_LEAD_IN):
        raise RowError(
            f"system is neither the functions lead-in nor the no-functions sentence: {body[:80]!r}"
        )
    return dedupe_functions(decode_functions(body.removeprefix(FUNCTIONS_LEAD_IN)))


def system_declaration(system: str) -> Declaration:
    """The functions a system prompt in glaive's form (the functions lead-in, without the
    `SYSTEM: ` tag) declares, as OpenAI tools, or why they cannot be read; none for a text not
    in that form. For rows of the other adapters (specregen/sources/declared.py); glaive's own
    rows are refused instead."""
    if not system.startswith(FUNCTIONS_LEAD_IN):
        return Declaration()
    try:
        specs, _dropped = parse_system(SYSTEM_TAG + system)
    except RowError as err:
        return Declaration(problem=f"system prompt: {err}")
    return Declaration([wrap_function(spec) for spec in specs or ()])


def decode_functions(text: str) -> list[dict[str, Any]]:
    """The concatenated function objects after the lead-in; separators between them vary."""
    decoder = json.JSONDecoder()
    specs: list[dict[str, Any]] = []
    pos = _SPACE.match(text).end()  # type: ignore[union-attr]
    while pos < len(text):
        where = f"system function #{len(specs)}"
        try:
            spec, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise RowError(
                f"{where} is not valid JSON ({err.msg} at character {err.pos} of the function "
                f"list): {text[err.pos : err.pos + 60]!r}"
            ) from None
        specs.append(check_function_spec(spec, where))
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
    if not specs:
        raise RowError("system has the functions lead-in but declares no function")
    return specs


def dedupe_functions(specs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    kept: dict[str, dict[str, Any]] = {}
    dropped: list[str] = []
    for spec in specs:
        name = spec["name"]
        if name not in kept:
            kept[name] = spec
        elif kept[name] == spec:
            dropped.append(name)
        else:
            raise RowError(f"system declares function {name!r} twice with different definitions")
    return list(kept.values()), dropped


# --- chat -----------------------------------------------------------------------------------


def parse_chat(chat: str, *, accept_object_arguments: bool = True) -> list[Turn]:
    """All turns of the chat, each checked on its own (stray tags, end markers, call syntax)."""
    tags = list(_TURN_TAG.finditer(chat))
    if not tags:
        raise RowError(f"chat has no turn tag (USER: / ASSISTANT: ...): {chat[:60]!r}")
    head = chat[: tags[0].start()]
    if head.strip():
        raise RowError(f"chat does not start with a turn tag: {head[:60]!r}")
    turns = []
    for i, tag in enumerate(tags):
        end = tags[i + 1].start() if i + 1 < len(tags) else len(chat)
        role = tag.group(1)
        try:
            turns.append(parse_turn(role, chat[tag.end() : end], accept_object_arguments))
        except RowError as err:
            raise RowError(f"chat turn #{i} ({role}): {err}") from None
    return turns


def parse_turn(role: str, raw: str, accept_object_arguments: bool) -> Turn:
    stray = _STRAY_TAG.search(raw)
    if stray:
        raise RowError(f"stray '{stray.group(1)}:' inside the turn (not at a turn boundary)")
    content = raw.strip()
    if role == ASSISTANT and content.endswith(END_OF_TEXT):
        content = content.removesuffix(END_OF_TEXT).rstrip()
    if END_OF_TEXT in content:
        where = "before the end of the turn" if role == ASSISTANT else "in a turn that has none"
        raise RowError(f"stray {END_OF_TEXT} {where}")
    if role != ASSISTANT or CALL_TAG not in content:
        return Turn(role, content)
    if not content.startswith(CALL_TAG):
        raise RowError(f"text before {CALL_TAG}: {clip(content[: content.index(CALL_TAG)])!r}")
    if content.count(CALL_TAG) > 1:
        raise RowError(f"more than one {CALL_TAG} in one turn")
    call = parse_call(content.removeprefix(CALL_TAG), accept_object_arguments)
    return Turn(role, content, call)


def parse_call(text: str, accept_object_arguments: bool = True) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of the text after `<functioncall>`."""
    try:
        whole = strict_json_loads(text)
    except json.JSONDecodeError as err:
        return _parse_quoted_call(text, err)
    except ValueError as err:  # NaN/Infinity: shaped like JSON, but not JSON
        raise RowError(f"arguments are not valid JSON: {err}") from None
    if not isinstance(whole, dict):
        raise RowError(f"call is not a JSON object (got {type_name(whole)})")
    name = whole.get("name")
    if not isinstance(name, str) or not name:
        raise RowError("call has no function name")
    if "arguments" not in whole:
        if "parameters" in whole:
            raise RowError("call has 'parameters' instead of 'arguments'")
        raise RowError("call has no 'arguments'")
    if isinstance(whole["arguments"], dict) and not accept_object_arguments:
        raise RowError("arguments written as a JSON object instead of a quoted string")
    return name, arguments_object(whole["arguments"])


def _parse_quoted_call(text: str, json_error: json.JSONDecodeError) -> tuple[str, dict[str, Any]]:
    head = _QUOTED_CALL_HEAD.match(text)
    if head is None:
        if json_error.pos >= len(text.rstrip()):
            raise RowError(f"truncated call: it stops at {text.strip()[-40:]!r}")
        raise RowError(
            f'call is not of the form {{"name": ..., "arguments": \'...\'}}: {text.strip()[:80]!r}'
        )
    if head.group("key") == "parameters":
        raise RowError("call has 'parameters' instead of 'arguments'")
    rest = text[head.end() :]
    closes = list(_QUOTE_CLOSE.finditer(rest))
    if not closes:
        raise RowError(f"truncated call: the quoted arguments never close: {rest[-40:]!r}")
    # Greedy: the last quote-brace closes the call, so apostrophes inside the JSON are kept.
    close = closes[-1]
    tail = rest[close.end() :].strip()
    if tail:
        if set(tail) == {"}"}:
            extra = "one '}'" if len(tail) == 1 else f"{len(tail)} '}}'"
            raise RowError(f"{extra} too many after the call")
        raise RowError(f"unexpected text after the call: {tail[:40]!r}")
    return head.group("name"), arguments_object(rest[: close.start()])


def validate_turns(turns: list[Turn], functions: list[dict[str, Any]] | None) -> None:
    """Row-level rules: who may speak first, what a response answers, what may be called."""
    if turns[0].role != USER:
        raise RowError(f"chat starts with a {turns[0].role} turn, not USER")
    require_user_text(turns[0].content, "the first USER turn")
    declared = {spec["name"] for spec in functions or []}
    awaiting_response = False
    for i, turn in enumerate(turns):
        if turn.role == FUNCTION_RESPONSE:
            if not awaiting_response:
                # Turn 0 is a USER turn (checked above), so there is always a turn before.
                raise RowError(
                    f"chat turn #{i}: FUNCTION RESPONSE follows no call (turn #{i - 1} is "
                    f"{turns[i - 1].role} without a {CALL_TAG})"
                )
            awaiting_response = False
            continue
        awaiting_response = turn.call is not None
        if turn.call is not None and turn.call[0] not in declared:
            listed = ", ".join(repr(n) for n in sorted(declared)) or "none"
            raise RowError(
                f"chat turn #{i} (ASSISTANT): calls undeclared function {turn.call[0]!r} "
                f"(declared: {listed})"
            )


def clip(text: str, chars: int = 60) -> str:
    """The end of a long text, enough to recognise it in a reject reason."""
    return text if len(text) <= chars else "…" + text[-chars:]


def first_reference(turns: list[Turn]) -> dict[str, Any] | None:
    """glaive's own answer to the first user turn, for comparison with the regenerated one."""
    if len(turns) < 2 or turns[1].role != ASSISTANT:
        return None
    answer = turns[1]
    if answer.call is not None:
        return call_reference(*answer.call)
    return text_reference(answer.content)

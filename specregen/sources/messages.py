"""Rows holding an OpenAI conversation: `messages [{role, content, ...}]` and optional `tools`.

Covers UltraChat-style rows and already-converted tool datasets. `tools` may be OpenAI-wrapped
or bare function specs, as a list or a JSON string. The system text is the row's own leading
system message, else none (the chat format's default applies). Every assistant tool call in the
row is checked (declared name, arguments a JSON object), as glaive rows are, so a broken row is
not half-used. With `turns="all"` the whole conversation is the Prompt
(`conversation_messages`), refused when the driver could not walk it (a call without its
results, a tool message answering nothing). A row without tools may declare functions in its
system message, glaive style (specregen/sources/declared.py).
"""

from __future__ import annotations

from typing import Any, Literal

from specregen.records import Prompt, SourceReject
from specregen.sources._common import (
    DEFAULT_SYSTEM_PROMPT,
    RowError,
    arguments_object,
    call_message,
    calls_reference,
    check_turns,
    conversation_prompt,
    make_prompt,
    parse_tools,
    prompt_messages,
    reject,
    require_object,
    require_user_text,
    text_reference,
    tool_names,
    type_name,
)
from specregen.sources.declared import declared_by
from specregen.sources.ids import row_id

# UltraChat names its id `prompt_id`.
ID_FIELDS = ("id", "prompt_id")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def convert(row: Any, *, dataset: str, row_label: str,
            turns: Literal["first", "all"] = "first") -> Prompt | SourceReject:
    """The row's first user turn as a Prompt (`turns="all"`: the whole conversation)."""
    check_turns(turns)
    sample_id = row_id(dataset, row, ID_FIELDS)
    try:
        fields = require_object(row)
        messages = require_messages(fields)
        tools = parse_tools(fields.get("tools"), "tools")
        calls = {
            i: assistant_calls(m, i) for i, m in enumerate(messages) if m["role"] == "assistant"
        }
        check_declared(calls, tools)
        system, user_at = system_and_user_index(messages)
        user = require_user_text(content_str(messages[user_at], user_at), f"messages[{user_at}]")
        meta = {"source_row": row_label,
                "reference_first_turn": reference(messages, calls, user_at)}
        if turns == "all":
            conversation = conversation_messages(messages, calls)
            return conversation_prompt(sample_id, conversation, tools=tools, meta=meta,
                                       declaration=declared_by(tools, conversation))
    except RowError as err:
        return reject(sample_id, row_label, str(err))
    return make_prompt(sample_id, system, user, tools=tools, meta=meta,
                       declaration=declared_by(tools, prompt_messages(system, user)))


def conversation_messages(messages: list[dict[str, Any]],
                          calls: dict[int, list[tuple[str, dict[str, Any]]]]
                          ) -> list[dict[str, Any]]:
    """The row's messages as the driver sends them: `developer` is a system message; calls get
    their arguments as JSON text and, when the row gave none, ids `call_{n}` (a tool message
    without `tool_call_id` then answers the calls in order)."""
    out: list[dict[str, Any]] = []
    n = 0
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "function":
            raise RowError(f"messages[{i}] is a legacy 'function' message; whole conversations "
                           "need 'tool' messages answering 'tool_calls'")
        if role == "developer":
            message = {**message, "role": "system"}
        if role == "assistant" and calls.get(i):
            rebuilt = call_message(calls[i], n, content=message.get("content") or "")
            for k, call in enumerate(message["tool_calls"]):
                given = call.get("id")
                if isinstance(given, str) and given:
                    rebuilt["tool_calls"][k]["id"] = given
                # The row's own argument text when it is one (a JSON object, checked above).
                args = call["function"].get("arguments")
                if isinstance(args, str):
                    rebuilt["tool_calls"][k]["function"]["arguments"] = args
            message = {**message, **rebuilt}
            n += len(calls[i])
        out.append(message)
    return out


def require_messages(fields: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" not in fields:
        raise RowError("missing field 'messages'")
    messages = fields["messages"]
    if not isinstance(messages, list):
        raise RowError(f"field 'messages' is not a list (got {type_name(messages)})")
    if not messages:
        raise RowError("field 'messages' is empty")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RowError(f"messages[{i}] is not an object (got {type_name(message)})")
        role = message.get("role")
        if role not in ROLES:
            raise RowError(f"messages[{i}] has unknown role {role!r}")
    return messages


def content_str(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        raise RowError(f"messages[{index}].content is not a string (got {type_name(content)})")
    return content


def system_and_user_index(messages: list[dict[str, Any]]) -> tuple[str | None, int]:
    system = DEFAULT_SYSTEM_PROMPT
    first = 0
    if messages[0]["role"] in ("system", "developer"):
        system = content_str(messages[0], 0)
        first = 1
    if first >= len(messages):
        raise RowError("messages hold a system message and no user turn")
    if messages[first]["role"] != "user":
        raise RowError(f"messages[{first}] is a {messages[first]['role']!r} turn, not 'user'")
    return system, first


def assistant_calls(message: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise RowError(f"messages[{index}].tool_calls is not a list")
    calls = []
    for k, call in enumerate(raw_calls):
        where = f"messages[{index}].tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RowError(f"{where} has no function name")
        try:
            calls.append((function["name"], arguments_object(function.get("arguments"))))
        except RowError as err:
            raise RowError(f"{where}: {err}") from None
    return calls


def check_declared(
    calls: dict[int, list[tuple[str, dict[str, Any]]]], tools: list[dict[str, Any]] | None
) -> None:
    declared = tool_names(tools)
    for index, turn_calls in calls.items():
        for name, _ in turn_calls:
            if name not in declared:
                raise RowError(f"messages[{index}] calls undeclared function {name!r}")


def reference(
    messages: list[dict[str, Any]],
    calls: dict[int, list[tuple[str, dict[str, Any]]]],
    user_at: int,
) -> dict[str, Any] | None:
    answer_at = user_at + 1
    if answer_at >= len(messages) or messages[answer_at]["role"] != "assistant":
        return None
    if calls.get(answer_at):
        return calls_reference(calls[answer_at])
    content = messages[answer_at].get("content")
    return text_reference(content) if isinstance(content, str) else None

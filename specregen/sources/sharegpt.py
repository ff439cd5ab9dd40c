"""ShareGPT rows: `conversations [{from, value}]`, optional `id`, `system` and `tools`.

Roles follow SpecForge: human→user; gpt/chatgpt/bing/bard→assistant; system→system. Also
LLaMA-Factory's converted glaive (`function_call` turns holding `{"name", "arguments"}`,
`observation` turns, `tools` as a JSON string of bare function specs, "" or "[]" for none) and
hermes' `tool` turns (taken as observations). Any other role is refused rather than dropped,
since dropping a turn silently changes what the next turn answers. With `turns="all"` the whole
conversation is the Prompt (`conversation_messages`). A row without tools may declare functions
in its system text, glaive style (specregen/sources/declared.py).
"""

from __future__ import annotations

from typing import Any, Literal

from specregen.jsonkind import strict_json_loads
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

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "function_call",
    "observation": "observation",
    "tool": "observation",
}

Turn = tuple[str, str]  # (role after mapping, value)
Call = tuple[str, dict[str, Any]]


def convert(row: Any, *, dataset: str, row_label: str,
            turns: Literal["first", "all"] = "first") -> Prompt | SourceReject:
    """The row's first human turn as a Prompt (`turns="all"`: the whole conversation)."""
    check_turns(turns)
    sample_id = row_id(dataset, row, ("id",))
    try:
        fields = require_object(row)
        chat = require_turns(fields)
        tools = parse_tools(fields.get("tools"), "tools")
        calls = validate_turns(chat, tools)
        system, user_at = system_and_user_index(chat, fields)
        user = require_user_text(chat[user_at][1], f"conversations[{user_at}].value")
        meta = {"source_row": row_label, "reference_first_turn": reference(chat, calls, user_at)}
        if turns == "all":
            messages = conversation_messages(system, chat[user_at:], calls, user_at)
            return conversation_prompt(sample_id, messages, tools=tools, meta=meta,
                                       declaration=declared_by(tools, messages))
    except RowError as err:
        return reject(sample_id, row_label, str(err))
    return make_prompt(sample_id, system, user, tools=tools, meta=meta,
                       declaration=declared_by(tools, prompt_messages(system, user)))


def conversation_messages(system: str | None, turns: list[Turn], calls: dict[int, list[Call]],
                          offset: int) -> list[dict[str, Any]]:
    """The conversation in OpenAI shape: a function_call turn is an assistant message with
    `tool_calls` (ids `call_{n}`; a gpt turn right before it is that message's content, as the
    model writes text and calls in one answer), each observation a `tool` message answering
    the next unanswered call."""
    messages: list[dict[str, Any]] = [] if system is None else [
        {"role": "system", "content": system}]
    n = 0
    pending: list[str] = []
    for i, (role, value) in enumerate(turns, start=offset):
        if role == "function_call":
            content = ""
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" not in last:
                content = messages.pop()["content"]
            message = call_message(calls[i], n, content=content)
            pending = [c["id"] for c in message["tool_calls"]]
            n += len(calls[i])
            messages.append(message)
        elif role == "observation":
            # validate_turns made sure a call is waiting for it.
            messages.append({"role": "tool", "tool_call_id": pending.pop(0), "content": value})
        else:
            messages.append({"role": role, "content": value})
    return messages


def require_turns(fields: dict[str, Any]) -> list[Turn]:
    if "conversations" not in fields:
        raise RowError("missing field 'conversations'")
    conversations = fields["conversations"]
    if not isinstance(conversations, list):
        raise RowError(f"field 'conversations' is not a list (got {type_name(conversations)})")
    if not conversations:
        raise RowError("field 'conversations' is empty")
    turns = []
    for i, turn in enumerate(conversations):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise RowError(f"{where} is not an object (got {type_name(turn)})")
        source_role = turn.get("from")
        if source_role not in ROLES:
            raise RowError(f"{where} has unknown role {source_role!r}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise RowError(f"{where}.value is not a string (got {type_name(value)})")
        turns.append((ROLES[source_role], value))
    return turns


def parse_function_call(value: str) -> list[Call]:
    """The call(s) of a function_call turn: one object, or a list for parallel calls."""
    try:
        decoded = strict_json_loads(value)
    except ValueError as err:
        raise RowError(f"function_call is not valid JSON: {err}") from None
    items = decoded if isinstance(decoded, list) else [decoded]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RowError("function_call has no function name")
        if "arguments" not in item:
            raise RowError("function_call has no 'arguments'")
        calls.append((item["name"], arguments_object(item["arguments"])))
    if not calls:
        raise RowError("function_call holds no call")
    return calls


def validate_turns(turns: list[Turn], tools: list[dict[str, Any]] | None) -> dict[int, list[Call]]:
    """Checks the whole conversation; returns the parsed calls by turn index."""
    declared = tool_names(tools)
    calls: dict[int, list[Call]] = {}
    pending = 0
    for i, (role, value) in enumerate(turns):
        where = f"conversations[{i}]"
        if role == "system" and i != 0:
            raise RowError(f"{where}: system turn after the start of the conversation")
        if role == "observation":
            if pending == 0:
                raise RowError(f"{where}: observation follows no function_call")
            pending -= 1
            continue
        pending = 0
        if role != "function_call":
            continue
        try:
            calls[i] = parse_function_call(value)
        except RowError as err:
            raise RowError(f"{where}: {err}") from None
        for name, _ in calls[i]:
            if name not in declared:
                raise RowError(f"{where}: calls undeclared function {name!r}")
        pending = len(calls[i])
    return calls


def system_and_user_index(turns: list[Turn], fields: dict[str, Any]
                          ) -> tuple[str | None, int]:
    row_system = fields.get("system")
    system: str | None
    if turns[0][0] == "system":
        system, first = turns[0][1], 1
    elif isinstance(row_system, str) and row_system:
        system, first = row_system, 0
    else:
        system, first = DEFAULT_SYSTEM_PROMPT, 0
    if first >= len(turns):
        raise RowError("conversations hold a system turn and no human turn")
    if turns[first][0] != "user":
        raise RowError(f"conversations[{first}] is a {turns[first][0]!r} turn, not a human turn")
    return system, first


def reference(
    turns: list[Turn], calls: dict[int, list[Call]], user_at: int
) -> dict[str, Any] | None:
    answer_at = user_at + 1
    if answer_at >= len(turns):
        return None
    role, value = turns[answer_at]
    if role == "function_call":
        return calls_reference(calls[answer_at])
    return text_reference(value) if role == "assistant" else None

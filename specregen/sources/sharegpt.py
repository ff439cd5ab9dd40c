"""ShareGPT rows: `conversations [{from, value}]`, optional `id`, `system` and `tools`.

Roles follow SpecForge: human→user; gpt/chatgpt/bing/bard→assistant; system→system. Also
LLaMA-Factory's converted glaive (`function_call` turns holding `{"name", "arguments"}`,
`observation` turns, `tools` as a JSON string of bare function specs, "" or "[]" for none) and
hermes' `tool` turns (taken as observations). Any other role is refused rather than dropped,
since dropping a turn silently changes what the next turn answers.
"""

from __future__ import annotations

from typing import Any

from specregen.records import Prompt, SourceReject
from specregen.sources._common import (
    DEFAULT_SYSTEM_PROMPT,
    RowError,
    arguments_object,
    calls_reference,
    make_prompt,
    parse_tools,
    reject,
    require_object,
    require_user_text,
    strict_json_loads,
    text_reference,
    tool_names,
    type_name,
)
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


def convert(row: Any, *, dataset: str, row_label: str) -> Prompt | SourceReject:
    sample_id = row_id(dataset, row, ("id",))
    try:
        fields = require_object(row)
        turns = require_turns(fields)
        tools = parse_tools(fields.get("tools"), "tools")
        calls = validate_turns(turns, tools)
        system, user_at = system_and_user_index(turns, fields)
        user = require_user_text(turns[user_at][1], f"conversations[{user_at}].value")
    except RowError as err:
        return reject(sample_id, row_label, str(err))
    meta = {"source_row": row_label, "reference_first_turn": reference(turns, calls, user_at)}
    return make_prompt(sample_id, system, user, tools=tools, meta=meta)


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

"""Helpers shared by the dataset adapters: row errors, field access, prompts, tools, references."""

from __future__ import annotations

import json
from typing import Any, Literal

from specregen.errors import UsageError
from specregen.jsonkind import json_kind, strict_json_loads
from specregen.records import Declaration, Prompt, SourceReject

# A row without a system text gets no system message: what the model then sees is its chat
# format's business (one template injects a default system prompt, another none), the
# same whether the server renders the template or we do.
DEFAULT_SYSTEM_PROMPT: str | None = None
# What a prompt without tools, and without functions in its system prompt, declares.
NONE_DECLARED = Declaration()


class RowError(UsageError):
    """A defect in one source row. The message names the field or turn and the problem; the
    adapters turn it into the row's `SourceReject` (the run goes on)."""


def reject(sample_id: str, row_label: str, problem: str) -> SourceReject:
    return SourceReject(sample_id=sample_id, row=row_label, reason=f"row {row_label}: {problem}")


def type_name(value: Any) -> str:
    """JSON's name for a value's type, since the rows are JSON and readers think in JSON."""
    return json_kind(value)


def require_object(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise RowError(f"row is not a JSON object (got {type_name(row)})")
    return row


def require_str(row: dict[str, Any], field: str) -> str:
    if field not in row:
        raise RowError(f"missing field {field!r}")
    value = row[field]
    if not isinstance(value, str):
        raise RowError(f"field {field!r} is not a string (got {type_name(value)})")
    return value


def require_user_text(text: str, where: str) -> str:
    # An empty prompt would make the model answer nothing in particular; that is no sample.
    if not text.strip():
        raise RowError(f"{where} is empty")
    return text


def prompt_messages(system: str | None, user: str) -> list[dict[str, Any]]:
    head = [] if system is None else [{"role": "system", "content": system}]
    return [*head, {"role": "user", "content": user}]


def make_prompt(
    sample_id: str,
    system: str | None,
    user: str,
    *,
    tools: list[dict[str, Any]] | None = None,
    tool_mode: str = "tools",
    meta: dict[str, Any],
    declaration: Declaration = NONE_DECLARED,
) -> Prompt:
    return Prompt(
        sample_id=sample_id,
        messages=prompt_messages(system, user),
        tools=tools,
        tool_mode=tool_mode,  # type: ignore[arg-type]
        meta=meta,
        # What the prompt declares, as the adapter read it (sources/declared.py).
        declared_tools=declaration.tools,
        declaration_problem=declaration.problem,
    )


Turns = Literal["first", "all"]
TURNS = ("first", "all")


def check_turns(turns: str) -> None:
    if turns not in TURNS:
        raise ValueError(f"turns must be one of {TURNS}, got {turns!r}")


def conversation_prompt(
    sample_id: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    tool_mode: str = "tools",
    meta: dict[str, Any],
    declaration: Declaration = NONE_DECLARED,
) -> Prompt:
    """A whole conversation (`turns: all`), checked the way the driver will walk it, so a row it
    could not regenerate turn by turn is refused here with the message that breaks it."""
    from specregen.conversation.plan import ConversationError, plan_conversation

    prompt = Prompt(sample_id=sample_id, messages=messages, tools=tools,
                    tool_mode=tool_mode, meta=meta, turns="all",  # type: ignore[arg-type]
                    declared_tools=declaration.tools, declaration_problem=declaration.problem)
    try:
        plan_conversation(prompt)
    except ConversationError as err:
        raise RowError(err.detail) from None
    return prompt


def call_message(calls: list[tuple[str, dict[str, Any]]], first_id: int,
                 content: str = "") -> dict[str, Any]:
    """An assistant message holding `calls`, with ids `call_{n}` counted over the conversation
    (the dataset's ids never reach the model: its results are re-addressed to the model's)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"call_{first_id + k}", "type": "function",
             "function": {"name": name, "arguments": dump_arguments(arguments)}}
            for k, (name, arguments) in enumerate(calls)
        ],
    }


def dump_arguments(arguments: dict[str, Any]) -> str:
    """Arguments as one line of JSON with raw unicode.

    The default separators reproduce glaive's own argument text for the common one-line case,
    so a reference stays as close to the source bytes as a re-serialization can.
    """
    return json.dumps(arguments, ensure_ascii=False)


def text_reference(content: str) -> dict[str, Any]:
    return {"kind": "text", "content": content}


def call_reference(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "tool_call", "name": name, "arguments": dump_arguments(arguments)}


def calls_reference(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A reference for one call, or for parallel calls when a turn holds several."""
    if len(calls) == 1:
        return call_reference(*calls[0])
    return {
        "kind": "tool_calls",
        "calls": [{"name": n, "arguments": dump_arguments(a)} for n, a in calls],
    }


def arguments_object(arguments: Any) -> dict[str, Any]:
    """Call arguments as a dict, from an object or from a string holding a JSON object."""
    if isinstance(arguments, str):
        try:
            arguments = strict_json_loads(arguments)
        except ValueError as err:
            raise RowError(f"arguments are not valid JSON: {err}") from None
    if not isinstance(arguments, dict):
        raise RowError(f"arguments are not a JSON object (got {type_name(arguments)})")
    return arguments


def check_function_spec(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise RowError(f"{where} is not a JSON object (got {type_name(spec)})")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise RowError(f"{where} has no function name")
    if "description" in spec and not isinstance(spec["description"], str):
        raise RowError(f"{where} ({name!r}): description is not a string")
    if "parameters" in spec and not isinstance(spec["parameters"], dict):
        raise RowError(f"{where} ({name!r}): parameters is not a JSON object")
    return spec


def wrap_function(spec: dict[str, Any]) -> dict[str, Any]:
    # The spec is kept as the source wrote it (key order included): the chat template renders it.
    return {"type": "function", "function": spec}


def parse_tools(value: Any, field: str) -> list[dict[str, Any]] | None:
    """A `tools` value as OpenAI tools; None when the row declares none.

    Accepts a list or a JSON string of one (LLaMA-Factory stores a string), holding either
    OpenAI-wrapped tools or bare function specs (wrapped here).
    """
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = strict_json_loads(value)
        except ValueError as err:
            raise RowError(f"field {field!r} is not valid JSON: {err}") from None
    if not isinstance(value, list):
        raise RowError(f"field {field!r} is not a list of tools (got {type_name(value)})")
    tools = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if isinstance(item, dict) and item.get("type") == "function" and "function" in item:
            check_function_spec(item["function"], f"{where}.function")
            tools.append(item)
        else:
            tools.append(wrap_function(check_function_spec(item, where)))
    return tools or None


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {tool["function"]["name"] for tool in tools or []}

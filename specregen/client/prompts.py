"""The prompts file of `specregen infer`: one JSON object a line, each a `Prompt`.

`parse_prompt_line` checks a line the way the run will use it (a whole conversation is walked
as the engine walks it); `read_prompts` reads an open file lazily, reporting each bad line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Literal, cast

from specregen.errors import UsageError
from specregen.records import TOOL_MODES, Prompt
from specregen.sources.declared import line_declaration

TURNS = ("first", "all")


class PromptLineError(UsageError, ValueError):
    """A prompts-file line that is not a usable prompt; the message says why."""


def parse_prompt_line(line: str, *, turns: str | None = None) -> Prompt:
    """One Prompt from a JSONL line `{sample_id, messages, tools?, tool_mode?, meta?, turns?,
    declared_tools?, declaration_problem?}`; a line that does not state its declared functions
    declares its tools, or those of a glaive-style system prompt (specregen/sources/declared.py).

    `turns` ("first" / "all") overrides the line's own (`specregen infer --turns all`). A whole
    conversation is checked the way the engine will walk it (the reason names the message)."""
    try:
        # Without the line's own newline: a line cut short would be reported at "line 2,
        # column 1", after it, instead of where it ends.
        row = json.loads(line.rstrip("\r\n"), parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise PromptLineError(f"not JSON ({exc.msg} at column {exc.pos + 1})") from None
    except ValueError as exc:  # NaN / Infinity: Python's json takes them, no server does
        raise PromptLineError(f"not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise PromptLineError(f"a JSON {type(row).__name__}, not an object")
    sample_id = row.get("sample_id")
    if not isinstance(sample_id, str) or not sample_id.strip():
        raise PromptLineError("'sample_id' is missing or not a non-empty string")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptLineError(f"sample {sample_id}: 'messages' is missing or not a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptLineError(f"sample {sample_id}: messages[{i}] has no string 'role'")
    tools = row.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise PromptLineError(f"sample {sample_id}: 'tools' is not a list of objects")
    declared = row.get("declared_tools")
    if declared is not None and not (
        isinstance(declared, list) and all(isinstance(t, dict) for t in declared)
    ):
        raise PromptLineError(f"sample {sample_id}: 'declared_tools' is not a list of objects")
    if not isinstance(row.get("declaration_problem"), str | None):
        raise PromptLineError(f"sample {sample_id}: 'declaration_problem' is not a string")
    declaration = line_declaration(row)
    tool_mode = row.get("tool_mode") or "tools"
    if tool_mode not in TOOL_MODES:
        raise PromptLineError(
            f"sample {sample_id}: 'tool_mode' must be one of {', '.join(TOOL_MODES)}"
        )
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise PromptLineError(f"sample {sample_id}: 'meta' is not an object")
    turns = turns or row.get("turns") or "first"
    if turns not in TURNS:
        raise PromptLineError(f"sample {sample_id}: 'turns' must be one of {', '.join(TURNS)},"
                              f" not {turns!r}")
    prompt = Prompt(
        sample_id=sample_id, messages=messages, tools=tools or None, tool_mode=tool_mode,
        meta=meta, turns=cast(Literal["first", "all"], turns),  # checked against TURNS above
        declared_tools=declaration.tools, declaration_problem=declaration.problem,
    )
    if turns == "all":
        from specregen.conversation.plan import ConversationError, plan_conversation

        try:
            plan_conversation(prompt)
        except ConversationError as exc:
            raise PromptLineError(f"sample {sample_id}: {exc.detail}") from None
    return prompt


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_prompts(handle: Any, report: Callable[[int, str], None]) -> Iterator[Prompt]:
    """Prompts of an open file (text, or binary: strict UTF-8), lazily; a bad line goes to
    `report(line_no, reason)`."""
    from specregen.client.preflight import decode_line

    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            yield parse_prompt_line(decode_line(line))
        except (PromptLineError, ValueError) as exc:
            report(number, str(exc))

"""What a prompt declares to the model: the functions the gate holds its calls to.

Every adapter states it on its Prompts (`Prompt.declared_tools`, `Prompt.declaration_problem`),
since only the adapter knows its dataset's system prompt form; the gate reads no system prompt.

- glaive: the functions of the row's system field in either tool mode (sent as `tools`, or
  left in the system prompt), None for a no-functions row. A row whose system field does not
  parse is refused, so its prompts state no problem.
- messages, sharegpt: the row's tools. A row without tools whose system message is in glaive's
  form (the functions lead-in, then JSON function objects: glaive converted to messages)
  declares those functions; one that does not parse is still a Prompt, the problem stated with
  it, and the gate quarantines its calls saying why (`declared_by`).
- opencodeinstruct, magicoder: none.

A prompt line that states nothing (a prompts file written by hand, a prompt chunk written before
adapters stated it) gets the rule of the generic adapters (`line_declaration`): for every
adapter above that is what it states, so such a chunk gates as it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from specregen.records import Declaration
from specregen.sources.glaive import system_declaration


def declared_by(tools: list[dict[str, Any]] | None, messages: Any) -> Declaration:
    """The generic adapters' statement: `tools`, else the functions a system message in
    glaive's form declares (or why they cannot be read), else none."""
    if tools:
        return Declaration(tools)
    system = _system_text(messages)
    if system is None:
        return Declaration()
    return _system_declaration(system)


def line_declaration(row: Mapping[str, Any]) -> Declaration:
    """A prompt line's own statement (`declared_tools`, `declaration_problem`), else the
    generic adapters' over its `tools` and `messages`."""
    if "declared_tools" in row:
        return Declaration(row["declared_tools"] or None, row.get("declaration_problem"))
    return declared_by(row.get("tools"), row.get("messages"))


def _system_text(messages: Any) -> str | None:
    for message in messages or ():
        if isinstance(message, dict) and message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


# Datasets repeat a few system prompts; the lists are shared, and nobody changes them.
_system_declaration = lru_cache(maxsize=1024)(system_declaration)

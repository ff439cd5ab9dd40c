"""Which functions a sample declared, and their parameter schemas.

Two places declare tools: the request's `tools` (OpenAI-wrapped or bare function specs), or, for
`tool_mode == "system_prompt"` samples without `tools`, the system message. The only system
prompt format understood is glaive's (the functions lead-in followed by concatenated JSON function
objects); its own parser, `sources.glaive.parse_system`, is reused as is by putting back the
`SYSTEM: ` tag the adapter removed. Any other system prompt declares no function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from specregen.gate.schema import Compiled, Outcome, compile_parameters, validate_compiled
from specregen.sources._common import RowError
from specregen.sources.glaive import FUNCTIONS_LEAD_IN, SYSTEM_TAG, parse_system

# Stands for "the spec has no `parameters` key", which means any arguments object.
NO_PARAMETERS: dict[str, Any] = {}
_SEEN_PER_DECLARATION = 256


@dataclass
class Declared:
    """Declared function names -> their `parameters` value (as written, possibly not a dict)."""

    schemas: dict[str, Any] = field(default_factory=dict)
    source: str = "none"  # "tools" | "system_prompt" | "none"
    # Why the declaration could not be read; None when it was read (or there was none).
    problem: str | None = None
    # Declarations are cached and shared by the samples that repeat them, so their compiled
    # validators are too, and the outcomes of arguments texts already seen (validation is a
    # pure function of the schema and the text; datasets repeat calls like {"city": "Paris"}).
    _compiled: dict[str, Compiled] = field(default_factory=dict, repr=False)
    _seen: dict[tuple[str, str], Outcome] = field(default_factory=dict, repr=False)

    def validate(self, name: str, arguments: dict[str, Any], text: str) -> Outcome:
        """Check a declared function's arguments (parsed from `text`) against its parameters."""
        key = (name, text)
        outcome = self._seen.get(key)
        if outcome is not None:
            return outcome
        compiled = self._compiled.get(name)
        if compiled is None:
            schema_text = json.dumps(self.schemas[name], ensure_ascii=False)
            compiled = self._compiled[name] = compile_parameters(schema_text)
        outcome = validate_compiled(compiled, arguments)
        if len(self._seen) >= _SEEN_PER_DECLARATION:
            self._seen.clear()  # bounded: at most this many texts per cached declaration
        self._seen[key] = outcome
        return outcome

    def describe(self, limit: int = 8) -> str:
        names = sorted(self.schemas)
        if not names:
            return "no function declared"
        shown = ", ".join(names[:limit])
        return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


def declared_tools(
    tools: list[dict[str, Any]] | None, messages: list[dict[str, Any]] | None
) -> Declared:
    """The functions a sample declared, from `tools`, else from its system prompt."""
    if tools:
        # Keyed by the JSON text: a dataset repeats the same few tool lists in every sample.
        # (Not by Python equality, which would take 1, 1.0 and true for one another.)
        return _from_tools(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    system = _system_text(messages)
    if system is None:
        return Declared()
    return _from_system_prompt(system)


def _system_text(messages: list[dict[str, Any]] | None) -> str | None:
    for message in messages or ():
        if isinstance(message, dict) and message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


@lru_cache(maxsize=1024)
def _from_tools(tools_json: str) -> Declared:
    schemas: dict[str, Any] = {}
    for i, item in enumerate(json.loads(tools_json)):
        spec = item.get("function") if isinstance(item, dict) and "function" in item else item
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(name, str) or not name:
            return Declared(schemas, "tools", f"tools[{i}] has no function name")
        parameters = spec.get("parameters", NO_PARAMETERS)
        if name in schemas and schemas[name] != parameters:
            return Declared(schemas, "tools", f"function {name!r} is declared twice, differently")
        schemas[name] = parameters
    return Declared(schemas, "tools")


@lru_cache(maxsize=1024)
def _from_system_prompt(system: str) -> Declared:
    if not system.startswith(FUNCTIONS_LEAD_IN):
        return Declared()
    try:
        specs, _dropped = parse_system(SYSTEM_TAG + system)
    except RowError as err:
        return Declared(source="system_prompt", problem=f"system prompt: {err}")
    schemas = {spec["name"]: spec.get("parameters", NO_PARAMETERS) for spec in specs or ()}
    return Declared(schemas, "system_prompt")

"""Which functions a sample declared, and their parameter schemas.

The declaration comes with the sample (`records.Declaration`): its prompt's, as the dataset's
adapter stated it (`Prompt.declaration`; pipeline/gating.py reads it from the prompt chunks), so
the gate reads no system prompt. A sample gated without one (a token file without its prompts)
declares the tools its request sent, if any.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from specregen.gate.schema import Compiled, Outcome, compile_parameters, validate_compiled
from specregen.records import Declaration, TokenSample

# A sample's prompt's declaration, if known.
DeclarationOf = Callable[[TokenSample], Declaration | None]

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


def by_prompt(declarations: Mapping[str, Declaration]) -> DeclarationOf:
    """Declarations by prompt id: a conversation's samples share their conversation's."""
    return lambda sample: declarations.get(sample.conversation_id or sample.sample_id)


def declared_tools(sample: TokenSample, declaration: Declaration | None = None) -> Declared:
    """The functions `sample` declared: its prompt's `declaration` when given, else the tools
    its request sent (all a token file gated without its prompts can say)."""
    # Where the model read them: the request's `tools` when it sent some, else the system prompt.
    source = "tools" if sample.tools else "system_prompt"
    if declaration is None:
        declaration = Declaration(sample.tools)
    if declaration.problem is not None:
        return Declared(source=source, problem=declaration.problem)
    if not declaration.tools:
        return Declared()
    # Keyed by the JSON text: a dataset repeats the same few tool lists in every sample.
    # (Not by Python equality, which would take 1, 1.0 and true for one another.)
    tools_json = json.dumps(declaration.tools, ensure_ascii=False, separators=(",", ":"))
    return _from_tools(tools_json, source)


@lru_cache(maxsize=1024)
def _from_tools(tools_json: str, source: str) -> Declared:
    schemas: dict[str, Any] = {}
    for i, item in enumerate(json.loads(tools_json)):
        spec = item.get("function") if isinstance(item, dict) and "function" in item else item
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(name, str) or not name:
            return Declared(schemas, source, f"tools[{i}] has no function name")
        parameters = spec.get("parameters", NO_PARAMETERS)
        if name in schemas and schemas[name] != parameters:
            return Declared(schemas, source, f"function {name!r} is declared twice, differently")
        schemas[name] = parameters
    return Declared(schemas, source)


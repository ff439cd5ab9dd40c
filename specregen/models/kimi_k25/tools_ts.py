"""Kimi K2.5's TypeScript-style tool declaration, as its tokenizer wrapper renders it.

Kimi K2.5's chat template puts `tools` into the first system block
(`<|im_system|>tool_declare<|im_middle|>{DECL}<|im_end|>`) not as JSON but as a
TypeScript-like `namespace functions { ... }` string that the HF tokenizer wrapper builds in
Python before rendering the template. Rebuilding K2.5's exact prompt tokens therefore needs a
byte-exact copy of that renderer.

Source ported
-------------
thinking-machines-lab/tinker-cookbook, `tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`
at commit 3cd853c948e7e0609880c67a89187519b0aec677 (Apache-2.0). That file is a copy of
`tool_declaration_ts.py` from the Hugging Face repo moonshotai/Kimi-K2.5 (function
`encode_tools_to_typescript_style`; the model repo is under Moonshot's Modified MIT licence).
The earlier tinker-cookbook copy at d0aaa8e50e7edec0ac2daf18c057bf88cfe99865 ("Copied from
kimi-k2.5-hf-tokenizer/tool_declaration_ts.py") differs from 3cd853c only in formatting.
This is a re-implementation of that behaviour, not a copy of the text; `deep_sort` follows
`deep_sort_dict` from the K2.5-era `tokenization_kimi.py` wrapper (seen in the renamed copy
paswans05/kite1.0@f374721 `tokenization_kite.py`).

Call order (what the wrapper's `apply_chat_template` does)
---------------------------------------------------------
1. `tools = deep_sort_dict(tools)` -- outside any try block, so a failure here is not a
   fallback but an error of the whole call. `deep_sort` here propagates errors the same way.
2. `encode_tools_to_typescript_style(tools)` inside `try/except Exception`; on an exception
   `tools_ts_str` stays unset. `encode_tools_to_typescript` = step 1 then step 2, and turns
   every exception of step 2 into `ToolDeclarationError`.
3. The template uses `{% if tools_ts_str %}`: when it is unset *or empty* (e.g. no tool has
   type "function") the block falls back to `tools | tojson(separators=(',', ':'))` of the
   deep-sorted tools. So both `ToolDeclarationError` and a "" result mean "JSON fallback".

Because of step 1, property order, `$defs` order and the order of the root fields of a
self-referencing schema are alphabetical in K2.5's prompts; `anyOf`, `enum` and `required`
lists keep their order.

Quirks kept on purpose (they are what K2.5 saw during training): Python `str()`/`repr()`
spellings such as `True`, `None` and `1.0` in enums, defaults and constraints; no escaping of
quotes in enum strings; a scalar `type` that is not a string rendered with `str()`; a
non-object `$defs` entry rendered as `interface X "a" | "b"`.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolDeclarationError", "deep_sort", "encode_tools_to_typescript"]

logger = logging.getLogger(__name__)

_INDENT = "  "
_FIELD_DELIMITER = ",\n"
_HEADER = "# Tools\n\n"
_NAMESPACE_OPEN = "## functions\nnamespace functions {\n"
_NAMESPACE_CLOSE = "}\n"
_DEFS_REF_PREFIX = "#/$defs/"
# A `"$ref": "#"` makes the original emit the root object as `interface parameters`.
_SELF_REF_NAME = "parameters"
_DEFAULT_FUNCTION_NAME = "function"

_STRING_CONSTRAINTS = ("maxLength", "minLength", "pattern")
_NUMBER_CONSTRAINTS = ("maximum", "minimum")
_ARRAY_CONSTRAINTS = ("minItems", "maxItems")

# Only these names are accepted inside a `type` list; anything else is a KeyError upstream.
_UNION_MEMBER_TYPES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}

# How upstream checks enum values against a declared type. bool passes the integer and number
# checks because bool is an int subclass; upstream behaves the same way.
_ENUM_VALUE_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
}


class ToolDeclarationError(ValueError):
    """The original encoder raises on this tool, so K2.5's template falls back to JSON."""

    def __init__(self, tool: str, field_path: str, reason: str) -> None:
        super().__init__(f"tool {tool}: field {field_path!r}: {reason}")
        self.tool = tool
        self.field_path = field_path
        self.reason = reason


class _FieldError(Exception):
    """Raised below the tool level, where the tool's name is not known yet."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field_path = field_path
        self.reason = reason


def deep_sort(obj: Any) -> Any:
    """Return `obj` with every dict's keys sorted, recursively (the wrapper's `deep_sort_dict`).

    Only `dict` and `list` are descended into, as upstream; tuples and other containers are
    returned untouched. Keys that cannot be compared raise `TypeError`, as upstream.
    """
    if isinstance(obj, dict):
        return {key: deep_sort(value) for key, value in sorted(obj.items())}
    if isinstance(obj, list):
        return [deep_sort(item) for item in obj]
    return obj


def encode_tools_to_typescript(tools: list[dict[str, Any]]) -> str:
    """Render OpenAI `tools` into the declaration K2.5 puts in its `tool_declare` block.

    Deep-sorts first, exactly like the wrapper. Returns "" for an empty list and when no tool
    has type "function" (the template then falls back to JSON). Raises `ToolDeclarationError`
    wherever the original encoder raises.
    """
    return _encode_sorted_tools(deep_sort(tools))


def _encode_sorted_tools(tools: list[Any]) -> str:
    if not tools:
        return ""
    functions = [
        declaration
        for index, tool in enumerate(tools)
        if (declaration := _declare_tool(index, tool)) is not None
    ]
    if not functions:
        return ""
    body = "\n".join(functions)
    return f"{_HEADER}{_NAMESPACE_OPEN}{body}\n{_NAMESPACE_CLOSE}"


def _declare_tool(index: int, tool: Any) -> str | None:
    """One tool's declaration, or None for tools the original skips."""
    if not isinstance(tool, dict):
        raise ToolDeclarationError(
            f"tools[{index}]", "(tool)", f"a tool must be an object, got {type(tool).__name__}"
        )
    if tool.get("type") != "function":
        return None
    function = tool.get("function", {})
    if not function:
        return None
    label = _tool_label(index, function)
    if not isinstance(function, dict):
        raise ToolDeclarationError(
            label, "function", f"must be an object, got {type(function).__name__}"
        )
    try:
        return _declare_function(function)
    except _FieldError as error:
        raise ToolDeclarationError(label, error.field_path, error.reason) from error


def _tool_label(index: int, function: Any) -> str:
    name = function.get("name") if isinstance(function, dict) else None
    return f"tools[{index}] ({name!r})" if name is not None else f"tools[{index}]"


# ---------------------------------------------------------------------------------------------
# Schema nodes. Parsing and rendering are separate phases, as upstream, because some errors
# (a bad additionalProperties, a non-string description) only surface when a node is rendered,
# and some nodes are never rendered (the root object of a self-referencing schema).
# ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _Node(ABC):
    field_path: str
    description: Any = ""
    constraints: dict[str, Any] = field(default_factory=dict)

    @abstractmethod
    def render(self, indent: str) -> str:
        """The TypeScript type expression, nested lines indented relative to `indent`."""

    def docstring(self, indent: str) -> str:
        """Comment lines (description, then constraints) that precede a field or array item."""
        lines: list[str] = []
        if self.description:
            lines.append(_comment_lines(self.description, indent, self.field_path))
        if self.constraints:
            joined = ", ".join(
                f"{key}: {value}"
                for key, value in sorted(self.constraints.items(), key=lambda kv: kv[0])
            )
            lines.append(f"{indent}// {joined}")
        return "".join(line + "\n" for line in lines)


@dataclass(kw_only=True)
class _Scalar(_Node):
    type_name: Any

    def render(self, indent: str) -> str:
        if self.type_name == "integer":
            return "number"
        return str(self.type_name)


@dataclass(kw_only=True)
class _Enum(_Node):
    values: list[Any]

    def render(self, indent: str) -> str:
        return " | ".join(
            f'"{value}"' if isinstance(value, str) else str(value) for value in self.values
        )


@dataclass(kw_only=True)
class _Union(_Node):
    members: list[str]

    def render(self, indent: str) -> str:
        return " | ".join(self.members)


@dataclass(kw_only=True)
class _Ref(_Node):
    ref_name: str

    def render(self, indent: str) -> str:
        return self.ref_name


@dataclass(kw_only=True)
class _AnyOf(_Node):
    options: list[_Node]

    def render(self, indent: str) -> str:
        return " | ".join(_render_joinable(option, indent) for option in self.options)


@dataclass(kw_only=True)
class _Array(_Node):
    item: _Node

    def render(self, indent: str) -> str:
        inner = indent + _INDENT
        item_doc = self.item.docstring(inner)
        if item_doc:
            return f"Array<\n{item_doc}{inner}{_render_joinable(self.item, inner)}\n{indent}>"
        # Upstream renders a one-line item at the outer indent, not the inner one.
        return f"Array<{self.item.render(indent)}>"


@dataclass(kw_only=True)
class _Property:
    name: str
    node: _Node
    optional: bool
    default: Any

    def render(self, indent: str) -> str:
        comments = self.node.docstring(indent)
        if self.default is not None:
            default = _default_literal(self.default, self.node.field_path)
            comments += f"{indent}// Default: {default}\n"
        mark = "?" if self.optional else ""
        return f"{comments}{indent}{self.name}{mark}: {self.node.render(indent)}"


@dataclass(kw_only=True)
class _Object(_Node):
    properties: list[_Property] = field(default_factory=list)
    # None, True, False, a parsed node, or junk that upstream only rejects when rendering.
    additional: Any = None

    def render(self, indent: str) -> str:
        inner = indent + _INDENT
        required = sorted((p for p in self.properties if not p.optional), key=lambda p: p.name)
        optional = sorted((p for p in self.properties if p.optional), key=lambda p: p.name)
        fields = [prop.render(inner) for prop in [*required, *optional]]
        if self.additional is not None:
            fields.append(f"{inner}[k: string]: {self._additional_type(inner)}")
        if not fields:
            return "{}"
        return f"{{\n{_FIELD_DELIMITER.join(fields)}\n{indent}}}"

    def _additional_type(self, indent: str) -> str:
        if self.additional is True:
            return "any"
        if self.additional is False:
            return "never"
        if isinstance(self.additional, _Node):
            return self.additional.render(indent)
        raise _FieldError(
            self.field_path + ".additionalProperties",
            f"unsupported additionalProperties {self.additional!r}",
        )


def _render_joinable(node: _Node, indent: str) -> str:
    """Render where upstream concatenates with `+`/`join`, which reject a non-string type.

    Elsewhere upstream formats the type with an f-string, so `_Scalar.render`'s `str()` is
    what it does there.
    """
    rendered = node.render(indent)
    if isinstance(node, _Scalar) and not isinstance(node.type_name, str):
        raise _FieldError(node.field_path + ".type", f"type {node.type_name!r} is not a string")
    return rendered


def _comment_lines(description: Any, indent: str, field_path: str) -> str:
    if not isinstance(description, str):
        raise _FieldError(
            field_path + ".description",
            f"description must be a string, got {type(description).__name__}",
        )
    # Empty lines stay empty: no indent and no `//`.
    return "\n".join(f"{indent}// {line}" if line else "" for line in description.split("\n"))


def _default_literal(value: Any, field_path: str) -> str:
    # Upstream: repr() for numbers and bools (so `True`, `1.0`), JSON for everything else.
    if isinstance(value, (int, float, bool)):
        return repr(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise _FieldError(field_path + ".default", f"default is not JSON: {error}") from error


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


class _Registry:
    """`$defs` seen so far in one function, in one flat namespace, as upstream."""

    def __init__(self) -> None:
        self.definitions: dict[Any, Any] = {}
        self.has_self_ref = False

    def register(self, defs: Any, field_path: str) -> None:
        if not defs:
            return
        if not isinstance(defs, dict):
            raise _FieldError(field_path, f"$defs must be an object, got {type(defs).__name__}")
        self.definitions.update(defs)

    def resolve(self, ref: Any, field_path: str) -> Any:
        if ref == "#":
            self.has_self_ref = True
            return {"$self_ref": True}
        if not isinstance(ref, str):
            raise _FieldError(field_path, f"$ref must be a string, got {ref!r}")
        if not ref.startswith(_DEFS_REF_PREFIX):
            raise _FieldError(field_path, f"unsupported $ref format {ref!r}")
        name = ref.split("/")[-1]
        # Definitions are registered while parsing, so a $ref to a $defs block that is parsed
        # later (e.g. one nested in a sibling property) is "not found", as upstream.
        if name not in self.definitions:
            raise _FieldError(field_path, f"$ref {ref!r} not found")
        return self.definitions[name]


def _parse_schema(schema: Any, registry: _Registry, field_path: str) -> _Node:
    if isinstance(schema, bool):
        if schema:
            return _Scalar(field_path=field_path, type_name="any")
        logger.warning("%s: boolean schema false is not supported, using null", field_path)
        return _Scalar(field_path=field_path, type_name="null")
    # Upstream fails on every non-dict, non-bool schema (TypeError/AttributeError/ValueError).
    if not isinstance(schema, dict):
        raise _FieldError(field_path, f"schema must be an object, got {type(schema).__name__}")
    if "$ref" in schema:
        return _parse_ref(schema, registry, field_path)
    if "anyOf" in schema:
        return _parse_any_of(schema, registry, field_path)
    if "enum" in schema:
        return _parse_enum(schema, field_path)
    if "type" in schema:
        return _parse_typed(schema, registry, field_path)
    if not schema:
        return _Scalar(field_path=field_path, type_name="any")
    raise _FieldError(
        field_path,
        "schema has none of $ref/anyOf/enum/type (e.g. oneOf, allOf or only a description)",
    )


def _parse_typed(schema: dict[str, Any], registry: _Registry, field_path: str) -> _Node:
    type_name = schema["type"]
    if isinstance(type_name, list):
        return _parse_union(schema, type_name, field_path)
    if type_name == "object":
        return _parse_object(schema, registry, field_path)
    if type_name == "array":
        return _parse_array(schema, registry, field_path)
    return _parse_scalar(schema, type_name, field_path)


def _parse_scalar(schema: dict[str, Any], type_name: Any, field_path: str) -> _Scalar:
    allowed: tuple[str, ...] = ()
    if type_name == "string":
        allowed = _STRING_CONSTRAINTS
    elif type_name in ("number", "integer"):
        allowed = _NUMBER_CONSTRAINTS
    return _Scalar(
        field_path=field_path,
        description=schema.get("description", ""),
        constraints=_constraints(schema, allowed),
        type_name=type_name,
    )


def _constraints(schema: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key in allowed}


def _parse_union(schema: dict[str, Any], type_names: list[Any], field_path: str) -> _Union:
    members: list[str] = []
    for position, type_name in enumerate(type_names):
        try:
            members.append(_UNION_MEMBER_TYPES[type_name])
        except (KeyError, TypeError):
            raise _FieldError(
                f"{field_path}.type[{position}]", f"unsupported type {type_name!r} in a type list"
            ) from None
    return _Union(field_path=field_path, description=schema.get("description", ""), members=members)


def _parse_enum(schema: dict[str, Any], field_path: str) -> _Enum:
    raw = schema["enum"]
    try:
        # Iterating, not validating, is what upstream does: a string enum becomes its chars.
        values = list(raw)
    except TypeError:
        raise _FieldError(field_path + ".enum", f"enum is not a list: {raw!r}") from None
    if "type" in schema:
        declared = _enum_declared_type(schema["type"], field_path)
        for value in values:
            _check_enum_value(value, declared, field_path)
    return _Enum(field_path=field_path, description=schema.get("description", ""), values=values)


def _enum_declared_type(type_name: Any, field_path: str) -> Any:
    if not isinstance(type_name, list):
        return type_name
    if len(type_name) == 1:
        return type_name[0]
    if len(type_name) == 2 and "null" in type_name:
        return type_name[0] if type_name[0] != "null" else type_name[1]
    raise _FieldError(field_path + ".type", f"enum type {type_name!r} is not supported")


def _check_enum_value(value: Any, declared: Any, field_path: str) -> None:
    if value is None:
        return
    for type_name, python_type in _ENUM_VALUE_TYPES.items():
        if declared == type_name and not isinstance(value, python_type):
            raise _FieldError(field_path + ".enum", f"enum value {value!r} is not a {type_name}")


def _parse_any_of(schema: dict[str, Any], registry: _Registry, field_path: str) -> _AnyOf:
    raw = schema["anyOf"]
    try:
        options_raw = list(raw)
    except TypeError:
        raise _FieldError(field_path + ".anyOf", f"anyOf is not a list: {raw!r}") from None
    options = [
        _parse_schema(option, registry, f"{field_path}.anyOf[{position}]")
        for position, option in enumerate(options_raw)
    ]
    return _AnyOf(field_path=field_path, description=schema.get("description", ""), options=options)


def _parse_ref(schema: dict[str, Any], registry: _Registry, field_path: str) -> _Ref:
    ref = schema["$ref"]
    resolved = registry.resolve(ref, field_path + ".$ref")
    if not isinstance(resolved, dict):
        raise _FieldError(field_path + ".$ref", f"$ref {ref!r} points at a non-object schema")
    # A definition that itself carries `$self_ref` is treated as the root, as upstream.
    ref_name = _SELF_REF_NAME if resolved.get("$self_ref", False) else ref.split("/")[-1]
    return _Ref(field_path=field_path, description=schema.get("description", ""), ref_name=ref_name)


def _parse_array(schema: dict[str, Any], registry: _Registry, field_path: str) -> _Array:
    items = schema.get("items")
    item = (
        _parse_schema(items, registry, field_path + ".items")
        if items
        else _Scalar(field_path=field_path + ".items", type_name="any")
    )
    return _Array(
        field_path=field_path,
        description=schema.get("description", ""),
        constraints=_constraints(schema, _ARRAY_CONSTRAINTS),
        item=item,
    )


def _parse_object(schema: dict[str, Any], registry: _Registry, field_path: str) -> _Object:
    node = _Object(field_path=field_path, description=schema.get("description", ""))
    if not schema:
        return node
    # Order matters: $defs are registered before any property can $ref them.
    if "$defs" in schema:
        registry.register(schema["$defs"], field_path + ".$defs")
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        additional = _parse_schema(additional, registry, field_path + ".additionalProperties")
    node.additional = additional
    if "properties" in schema:
        node.properties = _parse_properties(schema, registry, field_path)
    return node


def _parse_properties(
    schema: dict[str, Any], registry: _Registry, field_path: str
) -> list[_Property]:
    properties = schema["properties"]
    if not isinstance(properties, dict):
        raise _FieldError(
            field_path + ".properties",
            f"properties must be an object, got {type(properties).__name__}",
        )
    raw_required = schema.get("required", [])
    try:
        required = set(raw_required)
    except TypeError:
        raise _FieldError(
            field_path + ".required", f"required is not a list of names: {raw_required!r}"
        ) from None
    return [
        _Property(
            name=name,
            node=_parse_schema(prop, registry, f"{field_path}.properties.{name}"),
            optional=name not in required,
            default=prop.get("default") if isinstance(prop, dict) else None,
        )
        for name, prop in properties.items()
    ]


# ---------------------------------------------------------------------------------------------
# One function
# ---------------------------------------------------------------------------------------------


def _declare_function(function: dict[str, Any]) -> str:
    registry = _Registry()
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise _FieldError(
            "parameters", f"parameters must be an object, got {type(parameters).__name__}"
        )
    root = _parse_object(parameters, registry, "parameters")

    interfaces: list[str] = []
    # Checked before the $defs below are parsed, so a "#" ref inside a definition yields the
    # name `parameters` without the interface, as upstream.
    self_referencing = registry.has_self_ref
    if self_referencing:
        interfaces.append(_root_interface(root))
    interfaces.extend(_definition_interfaces(registry))

    name = function.get("name", _DEFAULT_FUNCTION_NAME)
    argument = _SELF_REF_NAME if self_referencing else root.render("")
    type_def = f"type {name} = (_: {argument}) => any;"

    description = function.get("description")
    description_block = _comment_lines(description, "", "description") if description else ""
    parts = ["\n".join(interfaces), description_block, type_def]
    return "\n".join(part for part in parts if part)


def _root_interface(root: _Object) -> str:
    # Upstream renders these in dict order (alphabetical after deep_sort), without the
    # required-first ordering and without additionalProperties.
    fields = _FIELD_DELIMITER.join(prop.render(_INDENT) for prop in root.properties)
    body = f"\n{fields}\n" if fields else ""
    return f"interface {_SELF_REF_NAME} {{{body}}}"


def _definition_interfaces(registry: _Registry) -> list[str]:
    interfaces: list[str] = []
    # A snapshot: $defs nested inside a definition are registered but get no interface.
    for def_name, def_schema in dict(registry.definitions).items():
        field_path = f"$defs.{def_name}"
        body = _parse_schema(def_schema, registry, field_path).render("")
        if not isinstance(def_schema, dict):
            raise _FieldError(field_path, "a $defs entry must be an object")
        description = def_schema.get("description", "")
        prefix = _comment_lines(description, "", field_path) + "\n" if description else ""
        interfaces.append(f"{prefix}interface {def_name} {body}")
    return interfaces

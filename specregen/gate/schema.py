"""Validating call arguments against dataset tool specs, which are only JSON-Schema-like.

Each spec is normalised once (cached by its JSON text), checked against its metaschema, and
compiled. The quirks handled, each counted in the report under its name when a call is validated
against a schema that needed it:

- `empty_parameters`: `parameters` absent, `null` or `{}` means any arguments object.
- `top_type_missing`: no `type` at the top means `"object"` (arguments are always an object).
- `python_type_name`: `int`, `float`, `str`, `bool`, `list`, `tuple`, `dict`, `None` and other
  capitalisations of JSON type names (`String`) are read as the JSON type they name. `any` drops
  the type constraint (`type_any`). Any other unknown type name makes the schema invalid.
- `required_undeclared`: a `required` name that `properties` does not declare is dropped (when
  `properties` is absent it declares none): the model cannot be faulted for leaving out a
  parameter the spec never described.
- `required_boolean`: draft-3 style `"required": true` inside a property moves to the parent's
  `required` list (`false` is dropped); `required_string`: `"required": "x"` is `["x"]`.
- `openapi_nullable`: OpenAPI's `"nullable": true` adds `"null"` to the type.
- `enum_type_widened`: `enum` values are compared as JSON values, strictly by type (1 and "1"
  differ, true and 1 differ; 1 and 1.0 are the same number). When an enum lists values whose type
  the sibling `type` does not allow, the type is widened to them: the spec offered them as
  choices, so picking one follows the spec.
- `items_array`: the draft 4-7 tuple form `"items": [...]` is 2020-12's `prefixItems`.
- `properties_empty_list`: `"properties": []` is `{}`.

Unknown keywords are ignored (jsonschema's own behaviour), and `format` is an annotation, not an
assertion. `$schema` naming draft 7 selects draft 7; anything else validates as draft 2020-12.
`$ref` resolves inside the schema only: nothing is ever fetched. A schema that is still invalid
after all this (wrong keyword types, an unknown type name, a top-level type other than object,
an unresolvable `$ref`) is reported as `schema_invalid` naming the tool, never raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource

_TYPE_NAMES = {
    "string": "string", "str": "string",
    "integer": "integer", "int": "integer", "long": "integer",
    "number": "number", "float": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array",
    "object": "object", "dict": "object",
    "null": "null", "none": "null",
}  # fmt: skip
_JSON_TYPES = frozenset(_TYPE_NAMES.values())

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")

_MAX_MESSAGE = 200


class SchemaInvalid(ValueError):
    """The declared schema cannot be used, even after the documented quirks."""


def _no_retrieval(uri: str) -> Any:
    # A dataset spec must not make the gate open network connections.
    # referencing's classes are attrs classes made with its own `frozen` wrapper, which
    # mypy's attrs plugin does not see through: it knows no fields, hence the ignores.
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_REGISTRY: Registry = Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Compiled:
    """A usable validator, or why there is none."""

    validator: Any | None
    quirks: tuple[str, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The result of validating one arguments object."""

    error: str | None = None  # a schema violation by the arguments
    problem: str | None = None  # the schema itself is unusable
    quirks: tuple[str, ...] = ()


def validate_arguments(parameters: Any, arguments: dict[str, Any]) -> Outcome:
    """Check an arguments object against a declared `parameters` value."""
    compiled = compile_parameters(json.dumps(parameters, ensure_ascii=False))
    return validate_compiled(compiled, arguments)


def validate_compiled(compiled: Compiled, arguments: dict[str, Any]) -> Outcome:
    if compiled.validator is None:
        return Outcome(problem=compiled.problem, quirks=compiled.quirks)
    try:
        errors = list(compiled.validator.iter_errors(arguments))
    except Exception as exc:  # unresolvable $ref, bad regex: the schema's fault, not the call's
        return Outcome(problem=f"{type(exc).__name__}: {_clip(str(exc))}", quirks=compiled.quirks)
    if not errors:
        return Outcome(quirks=compiled.quirks)
    error = best_match(errors)
    where = error.json_path if error.absolute_path else "arguments"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return Outcome(error=f"{error.validator} at {where}: {_clip(error.message)}{more}",
                   quirks=compiled.quirks)


@lru_cache(maxsize=4096)
def compile_parameters(parameters_json: str) -> Compiled:
    """A validator for a `parameters` value given as JSON text (the cache key)."""
    parameters = json.loads(parameters_json)
    quirks: list[str] = []
    try:
        cls = _validator_class(parameters)
        schema = normalize_parameters(parameters, quirks, tuple_items=cls is Draft7Validator)
        cls.check_schema(schema)
        validator = cls(schema, registry=_REGISTRY)
    except SchemaInvalid as exc:
        return Compiled(None, _unique(quirks), str(exc))
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top"
        return Compiled(None, _unique(quirks), f"at {where}: {_clip(exc.message)}")
    return Compiled(validator, _unique(quirks))


def _unique(quirks: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(quirks))


def _validator_class(parameters: Any) -> type[Draft7Validator] | type[Draft202012Validator]:
    uri = parameters.get("$schema") if isinstance(parameters, dict) else None
    return Draft7Validator if isinstance(uri, str) and "draft-07" in uri else Draft202012Validator


def normalize_parameters(parameters: Any, quirks: list[str], *, tuple_items: bool = False) -> Any:
    """The top-level `parameters` as a schema jsonschema accepts (quirks listed in `quirks`)."""
    if parameters is None or parameters == {}:
        quirks.append("empty_parameters")
        return {"type": "object"}
    if not isinstance(parameters, dict):
        raise SchemaInvalid(f"parameters is a {type(parameters).__name__}, not an object")
    schema = _normalize(parameters, quirks, tuple_items, "parameters")
    if "type" not in schema:
        quirks.append("top_type_missing")
        schema["type"] = "object"
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if "object" not in types:
        raise SchemaInvalid(f"top-level type is {schema['type']!r}, but arguments are an object")
    return schema


def _normalize(schema: Any, quirks: list[str], tuple_items: bool, where: str) -> Any:
    if not isinstance(schema, dict):
        return schema  # booleans are schemas; anything else is left to check_schema
    out = dict(schema)
    if "type" in out:
        out["type"] = _json_type(out["type"], quirks, where)
        if out["type"] is None:
            del out["type"]
    if out.get("nullable") is True and "type" in out:
        quirks.append("openapi_nullable")
        out["type"] = _add_types(out["type"], ["null"])
    if isinstance(out.get("enum"), list) and "type" in out:
        out["type"] = _widen_for_enum(out["type"], out["enum"], quirks)
    if out.get("properties") == []:
        quirks.append("properties_empty_list")
        out["properties"] = {}
    if isinstance(out.get("required"), str):
        quirks.append("required_string")
        out["required"] = [out["required"]]
    if isinstance(out.get("required"), bool):
        # A draft-3 flag outside `properties` (the parent moves the ones inside): no meaning left.
        quirks.append("required_boolean")
        del out["required"]
    if isinstance(out.get("properties"), dict):
        out["properties"], required = _normalize_properties(out, quirks, tuple_items, where)
        if required is not None:
            out["required"] = required
    if isinstance(out.get("required"), list) and "patternProperties" not in out:
        properties = out.get("properties")
        declared = properties if isinstance(properties, dict) else {}
        kept = [n for n in out["required"] if not isinstance(n, str) or n in declared]
        if len(kept) != len(out["required"]):
            quirks.append("required_undeclared")
            out["required"] = kept
    for key in _SCHEMA_MAPS:
        if key != "properties" and isinstance(out.get(key), dict):
            out[key] = {k: _normalize(v, quirks, tuple_items, f"{where}.{key}.{k}")
                        for k, v in out[key].items()}
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = _normalize(out[key], quirks, tuple_items, f"{where}.{key}")
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_normalize(s, quirks, tuple_items, f"{where}.{key}") for s in out[key]]
    items = out.get("items")
    if isinstance(items, list) and not tuple_items:
        quirks.append("items_array")
        out["prefixItems"] = [_normalize(s, quirks, tuple_items, f"{where}.items") for s in items]
        del out["items"]
    elif items is not None:
        out["items"] = (
            [_normalize(s, quirks, tuple_items, f"{where}.items") for s in items]
            if isinstance(items, list) else _normalize(items, quirks, tuple_items, f"{where}.items")
        )
    return out


def _normalize_properties(
    schema: dict[str, Any], quirks: list[str], tuple_items: bool, where: str
) -> tuple[dict[str, Any], Any]:
    """The normalised properties, and the `required` value once draft-3 flags are moved up."""
    properties: dict[str, Any] = {}
    required = schema.get("required")
    for name, sub in schema["properties"].items():
        if isinstance(sub, dict) and isinstance(sub.get("required"), bool):
            quirks.append("required_boolean")
            if sub["required"]:
                listed = required if isinstance(required, list) else []
                required = listed if name in listed else [*listed, name]
            sub = {k: v for k, v in sub.items() if k != "required"}
        properties[name] = _normalize(sub, quirks, tuple_items, f"{where}.{name}")
    return properties, required


def _json_type(value: Any, quirks: list[str], where: str) -> Any:
    if isinstance(value, list):
        mapped = [_json_type(v, quirks, where) for v in value]
        if any(m is None for m in mapped):
            return None  # "any" in a union makes the union any
        return list(dict.fromkeys(mapped))
    if not isinstance(value, str):
        raise SchemaInvalid(f"{where}: type {value!r} is not a type name")
    if value in _JSON_TYPES:
        return value
    lowered = value.strip().lower()
    if lowered == "any":
        quirks.append("type_any")
        return None
    if lowered in _TYPE_NAMES:
        quirks.append("python_type_name")
        return _TYPE_NAMES[lowered]
    raise SchemaInvalid(f"{where}: unknown type {value!r}")


def _add_types(current: Any, extra: list[str]) -> Any:
    types = current if isinstance(current, list) else [current]
    merged = list(dict.fromkeys([*types, *extra]))
    return merged if len(merged) > 1 else merged[0]


def _widen_for_enum(current: Any, enum: list[Any], quirks: list[str]) -> Any:
    allowed = set(current if isinstance(current, list) else [current])
    missing = []
    for value in enum:
        kind = _type_of(value)
        fits = kind in allowed or (kind == "integer" and "number" in allowed) or (
            kind == "number" and "integer" in allowed and float(value).is_integer()
        )
        if not fits and kind not in missing:
            missing.append(kind)
    if not missing:
        return current
    quirks.append("enum_type_widened")
    return _add_types(current, missing)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _clip(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

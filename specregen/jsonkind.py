"""JSON as JSON means it: the name of a Python value's type (rows, arguments and schemas are
JSON, and so are the words error messages should use for them), and a loader that takes no
NaN/Infinity."""

from __future__ import annotations

import json
from typing import Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json_loads(text: str) -> Any:
    """json.loads without NaN/Infinity, which Python accepts but JSON (and other parsers) do not."""
    return json.loads(text, parse_constant=_reject_constant)


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__

"""JSON's name for a Python value's type: rows, arguments and schemas are JSON, and so are the
words error messages should use for them."""

from __future__ import annotations

from typing import Any


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

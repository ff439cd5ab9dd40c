"""Validation errors of a YAML config, said the way its author wrote it.

Pydantic names a place by its path (`datasets.2.adaptr`); in a config of many datasets the
index means nothing to its author, who knows them by name. So a list entry with a `name` is
named by it (`datasets[B3_magicoder].adaptr`), and an unknown field gets the nearest known one
(`unknown field (did you mean 'adapter'?)`). Values are never echoed (a key may have been pasted
into the wrong field).
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def describe_errors(exc: ValidationError, model: type[BaseModel], raw: Any) -> list[str]:
    """One line per error: where (list entries by name), and what is wrong."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = tuple(error["loc"])
        where = _where(loc, raw)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            message = "unknown field"
            known = _fields_at(model, loc[:-1])
            nearest = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
            if nearest:
                message += f" (did you mean {nearest[0]!r}?)"
            elif known:
                message += f" (known: {', '.join(sorted(known))})"
        elif error["type"] == "missing":
            message = "required field missing"
        # Cross-field checks name their field at the start of the message themselves.
        lines.append(f"{where}: {message}" if where else message)
    return lines


def _where(loc: tuple[Any, ...], raw: Any) -> str:
    out = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            out += f"[{name}]" if isinstance(name, str) and name else f"[{part}]"
            node = item
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at `path` below `model` ([] if there is none)."""
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue  # a list's entry: the entry's model was found with the list's field
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel class inside an annotation (`X`, `X | None`, `list[X]`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None

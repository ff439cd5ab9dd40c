"""Dataset adapters: read a source file and yield one `Prompt` or `SourceReject` per row.

    for record in read_source("glaive", "hf://datasets/glaiveai/glaive-function-calling-v2/"
                              "glaive-function-calling-v2.json", dataset="B1_glaive", limit=100):
        ...

Every Prompt is single-turn: `[system, first user turn]` with the dataset's own system text, or
`[first user turn]` when it has none (the chat format's template then applies its default). The
source's own answer to that turn is kept in `meta["reference_first_turn"]`, and
`meta["source_row"]` says where the row came from. Each Prompt states the functions it declares
(`declared_tools`, sent as `tools` or written in its system prompt: `declared.py`), which the
gate holds its calls to.

An adapter in `ADAPTERS` converts one decoded row; `read_source` does the reading (any fsspec
URL; JSON array, JSONL or parquet), undecodable rows, duplicates and `limit`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specregen.records import Prompt, SourceReject
from specregen.sources import glaive, magicoder, messages, opencodeinstruct, sharegpt
from specregen.sources._common import DEFAULT_SYSTEM_PROMPT, reject
from specregen.sources._io import SeenIds, iter_rows
from specregen.sources.ids import raw_text_id

__all__ = [
    "ADAPTERS",
    "BUNDLED_SAMPLES",
    "DEFAULT_SYSTEM_PROMPT",
    "SAMPLES_DIR",
    "Adapter",
    "read_source",
]

# (row, *, dataset, row_label, **options) -> Prompt | SourceReject
Adapter = Callable[..., Prompt | SourceReject]

ADAPTERS: dict[str, Adapter] = {
    "glaive": glaive.convert,
    "opencodeinstruct": opencodeinstruct.convert,
    "magicoder": magicoder.convert,
    "messages": messages.convert,
    "sharegpt": sharegpt.convert,
}

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "assets" / "samples"
# Small demo sources shipped with the package: dataset name -> (adapter, path).
BUNDLED_SAMPLES: dict[str, tuple[str, Path]] = {
    "B1_glaive": ("glaive", SAMPLES_DIR / "B1_glaive.json"),
    "B2_opencodeinstruct": ("opencodeinstruct", SAMPLES_DIR / "B2_opencodeinstruct.parquet"),
    "B3_magicoder": ("magicoder", SAMPLES_DIR / "B3_magicoder.jsonl"),
}

_ROW_PARAMETERS = ("row", "dataset", "row_label")


def read_source(
    adapter: str,
    source: str | Path,
    *,
    dataset: str,
    limit: int | None = None,
    **options: Any,
) -> Iterator[Prompt | SourceReject]:
    """Prompts and rejects of `source`, in source order, stopping after `limit` Prompts.

    Arguments are checked here, before any reading, so a typo fails at the call and not at the
    first row. A row whose sample_id was already seen is rejected as a duplicate.
    """
    convert = _adapter(adapter)
    _check_options(adapter, convert, options)
    if not dataset:
        raise ValueError("dataset must be a non-empty name (it prefixes content-hash ids)")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    return _records(convert, str(source), dataset=dataset, limit=limit, options=options)


def _records(
    convert: Adapter, source: str, *, dataset: str, limit: int | None, options: dict[str, Any]
) -> Iterator[Prompt | SourceReject]:
    if limit == 0:
        return
    seen = SeenIds()  # bounded per id (~13-26 B): see SeenIds
    prompts = 0
    for row in iter_rows(source):
        if row.error is not None:
            record: Prompt | SourceReject = reject(
                raw_text_id(dataset, row.raw), row.label, row.error
            )
        else:
            record = convert(row.value, dataset=dataset, row_label=row.label, **options)
        if not seen.add(record.sample_id):
            record = reject(
                record.sample_id,
                row.label,
                f"duplicate of sample_id {record.sample_id} (an earlier row has the same id)",
            )
        yield record
        if isinstance(record, Prompt):
            prompts += 1
            if limit is not None and prompts >= limit:
                return


def _adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise ValueError(f"unknown adapter {name!r}; known adapters: {known}") from None


def _check_options(name: str, convert: Adapter, options: dict[str, Any]) -> None:
    """Option names from the adapter's signature; Literal and bool options checked by value."""
    accepted = {
        p: param
        for p, param in inspect.signature(convert).parameters.items()
        if p not in _ROW_PARAMETERS
    }
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = ", ".join(sorted(accepted)) or "no options"
        raise ValueError(f"adapter {name!r} does not take {', '.join(unknown)}; it takes: {takes}")
    hints = typing.get_type_hints(convert)
    for option, value in options.items():
        hint = hints.get(option)
        if typing.get_origin(hint) is typing.Literal and value not in typing.get_args(hint):
            raise ValueError(
                f"adapter {name!r}: {option} must be one of {typing.get_args(hint)}, got {value!r}"
            )
        if hint is bool and not isinstance(value, bool):
            raise ValueError(f"adapter {name!r}: {option} must be a bool, got {value!r}")

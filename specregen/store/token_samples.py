"""TokenSample rows as parquet: one schema, written in row groups so memory stays flat."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from specregen.records import TokenSample, ToolCall

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("prompt_len", pa.int32()),
        ("completion_len", pa.int32()),
        ("status", pa.string()),
        ("flags", pa.list_(pa.string())),
        ("usage_prompt_delta", pa.int32()),
        ("usage_completion_delta", pa.int32()),
        ("reference_match", pa.string()),
        ("error", pa.string()),
        ("thinking", pa.bool_()),
        ("reasoning", pa.string()),
        ("content", pa.string()),
        # JSON text: a list of {"id", "name", "arguments"} with arguments verbatim.
        ("tool_calls", pa.string()),
        ("api_tool_calls", pa.string()),
        ("finish_reason", pa.string()),
        # JSON text of the request's messages.
        ("messages", pa.string()),
        # JSON text of the declared tools, or null.
        ("tools", pa.string()),
        ("tool_mode", pa.string()),
    ]
)

ROW_GROUP_SIZE = 2_000


_CALL_COLUMNS = ("tool_calls", "api_tool_calls")
_JSON_COLUMNS = ("messages", "tools")


def to_row(sample: TokenSample) -> dict[str, Any]:
    row = asdict(sample)
    for name in _CALL_COLUMNS:
        row[name] = json.dumps(row[name], ensure_ascii=False)
    for name in _JSON_COLUMNS:
        row[name] = None if row[name] is None else json.dumps(row[name], ensure_ascii=False)
    return row


def from_row(row: dict[str, Any]) -> TokenSample:
    values = {name: row.get(name) for name in SCHEMA.names}
    for name in _CALL_COLUMNS:
        values[name] = [ToolCall(**c) for c in json.loads(row.get(name) or "[]")]
    for name in _JSON_COLUMNS:
        values[name] = json.loads(row[name]) if row.get(name) else None
    values["flags"] = list(values["flags"] or [])
    values["input_ids"] = list(values["input_ids"] or [])
    values["loss_mask"] = list(values["loss_mask"] or [])
    return TokenSample(**values)


def write_token_samples(samples: Iterable[TokenSample], where: Any) -> int:
    """Write samples to a parquet file (a path or an open binary file); returns the row count."""
    count = 0
    with pq.ParquetWriter(where, SCHEMA) as writer:
        batch: list[dict[str, Any]] = []
        for sample in samples:
            batch.append(to_row(sample))
            if len(batch) >= ROW_GROUP_SIZE:
                writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))
                count += len(batch)
                batch = []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))
            count += len(batch)
    return count


def read_token_samples(where: Any) -> Iterator[TokenSample]:
    """Samples back from a parquet file, one row group at a time."""
    for batch in pq.ParquetFile(where).iter_batches(batch_size=ROW_GROUP_SIZE):
        for row in batch.to_pylist():
            yield from_row(row)


QUARANTINE_SCHEMA = SCHEMA.append(pa.field("reasons", pa.list_(pa.string())))


def token_samples_bytes(
    samples: list[TokenSample], reasons: list[list[str]] | None = None
) -> bytes:
    """A whole parquet file in memory (one chunk's worth), with `reasons` when given."""
    import io

    rows = [to_row(s) for s in samples]
    schema = SCHEMA
    if reasons is not None:
        schema = QUARANTINE_SCHEMA
        for row, why in zip(rows, reasons, strict=True):
            row["reasons"] = why
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    return buffer.getvalue()

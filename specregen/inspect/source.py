"""What the inspector reads: samples from a token parquet (with the gate's `reasons` and the
`evidence` column when present), the tokenizer the file records, and the server's own ids.

The token parquet does not store the server's ids (only `reference_match`), so they come from
the raw log: a folder or JSONL given with `--reference`, or, for a file inside a pipeline's
storage (`{storage}/{dataset}/reconstruct|gate/...`), the dataset's `rawlog/` beside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from specregen.errors import UsageError
from specregen.records import TokenSample
from specregen.store.token_samples import SCHEMA, from_row

# The first "sample_id" of a raw log line is the record's own (the writer puts it before the
# request and response): a cheap way to skip other samples' lines without parsing them.
_SAMPLE_ID = re.compile(rb'"sample_id":\s*"((?:[^"\\]|\\.)*)"')
# A column the parquet may one day carry; read when present.
REFERENCE_COLUMN = "reference_completion_ids"


class InspectError(UsageError):
    """An input the inspector cannot use; the message names the file and the reason."""


@dataclass
class Row:
    sample: TokenSample
    evidence: str | None = None
    reasons: list[str] = field(default_factory=list)
    reference_ids: list[int] | None = None


@dataclass(frozen=True)
class Selection:
    sample: str | None = None
    flag: str | None = None
    status: str | None = None

    def wants(self, sample: TokenSample) -> bool:
        if self.sample is not None and sample.sample_id != self.sample:
            return False
        if self.flag is not None and self.flag not in sample.flags:
            return False
        return self.status is None or sample.status == self.status

    def describe(self) -> str:
        parts = [f"{k} {v!r}" for k, v in (("sample", self.sample), ("flag", self.flag),
                                             ("status", self.status)) if v is not None]
        return " and ".join(parts) or "any sample"


def open_parquet(path: Path) -> pq.ParquetFile:
    if not path.is_file():
        raise InspectError(f"{path}: no such file (give a parquet written by `specregen "
                           "reconstruct`, or a gate shard)")
    try:
        handle = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InspectError(f"cannot read {path} as parquet: {exc}") from None
    missing = [n for n in ("sample_id", "input_ids", "loss_mask", "prompt_len", "status")
               if n not in handle.schema_arrow.names]
    if missing:
        raise InspectError(f"{path} is not a token parquet: it lacks the column(s) "
                           f"{', '.join(missing)}")
    return handle


def read_rows(path: Path, selection: Selection, limit: int | None = None) -> Iterator[Row]:
    """The selected rows in file order, at most `limit`."""
    handle = open_parquet(path)
    names = handle.schema_arrow.names
    wanted = [n for n in names if n in SCHEMA.names or n in ("evidence", "reasons",
                                                             REFERENCE_COLUMN)]
    count = 0
    for batch in handle.iter_batches(batch_size=512, columns=wanted):
        for raw in batch.to_pylist():
            try:
                sample = from_row(raw)
            except (TypeError, ValueError, KeyError) as exc:
                raise InspectError(f"{path}: row {raw.get('sample_id')!r} is unreadable: "
                                   f"{exc}") from None
            if not selection.wants(sample):
                continue
            yield Row(sample=sample, evidence=raw.get("evidence"),
                      reasons=list(raw.get("reasons") or []),
                      reference_ids=raw.get(REFERENCE_COLUMN))
            count += 1
            if limit is not None and count >= limit:
                return


def token_meta(path: Path) -> Any:
    """What the file records about its ids (tokenizer and format), or None when it records
    nothing (a file written before the metadata existed)."""
    from specregen.store.token_samples import TokenFileError, read_token_meta

    try:
        return read_token_meta(path)
    except (TokenFileError, pa.ArrowException, OSError) as exc:
        raise InspectError(str(exc)) from None


# --- the server's own ids ---------------------------------------------------------------------


def find_rawlog(path: Path) -> Path | None:
    """The dataset's raw log folder when `path` sits in a pipeline's storage layout."""
    for parent in list(path.resolve().parents)[:5]:
        candidate = parent / "rawlog"
        if candidate.is_dir():
            return candidate
    return None


def reference_ids(source: Path, wanted: set[str]) -> dict[str, list[int]]:
    """sample_id -> the server's completion ids, from a raw log folder (any depth of
    `part-*.jsonl`) or a JSONL file of `{sample_id, reference_completion_ids}` lines.

    The last final record with ids wins (a later run of the same sample replaces an earlier).
    """
    if source.is_dir():
        files = sorted(source.rglob("part-*.jsonl"))
        if not files:
            raise InspectError(f"{source} holds no raw log parts (part-*.jsonl)")
    elif source.is_file():
        files = [source]
    else:
        raise InspectError(f"{source}: no such file or folder")
    found: dict[str, list[int]] = {}
    for file in files:
        with file.open("rb") as handle:
            for line in handle:
                # Cheap pre-filter: most lines of a big log are other samples or lack ids.
                hit = _SAMPLE_ID.search(line)
                if hit is None or b"reference_completion_ids" not in line:
                    continue
                raw_id = hit.group(1)
                # An id with JSON escapes is left to the parser below.
                if b"\\" not in raw_id and raw_id.decode("utf-8", "replace") not in wanted:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a crashed writer
                if not isinstance(record, dict):
                    continue
                ids = record.get("reference_completion_ids")
                if (record.get("sample_id") in wanted and isinstance(ids, list)
                        and record.get("final", True) and all(type(t) is int for t in ids)):
                    found[record["sample_id"]] = ids
    return found

"""TokenSample rows as parquet: one schema, written in row groups so memory stays flat.

The file's schema metadata (key `specregen`) names what the ids were built with: the tokenizer
(how to load it, its name, a fingerprint of its vocabulary) and the format, so a reader can load
the same tokenizer and refuse another (`read_token_meta`, `check_tokenizer_matches`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from specregen.errors import UsageError
from specregen.records import TokenSample, ToolCall

if TYPE_CHECKING:
    from specregen.models.chat_format import ChatFormat
    from specregen.models.tokenizer import Tokenizer

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
        # reference | usage_exact | usage_tolerated | none (docs/evidence.md)
        ("evidence", pa.string()),
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
        # Whole conversations (specregen/conversation): null on single-turn samples.
        ("conversation_id", pa.string()),
        ("user_turn", pa.int32()),
        ("stop_reason", pa.string()),
    ]
)

ROW_GROUP_SIZE = 2_000


_CALL_COLUMNS = ("tool_calls", "api_tool_calls")
_JSON_COLUMNS = ("messages", "tools")


# Columns a file written before they existed may lack; readers fill them with None.
OPTIONAL_COLUMNS = frozenset({"evidence", "conversation_id", "user_turn", "stop_reason"})
META_KEY = b"specregen"


class TokenFileError(UsageError, ValueError):
    """A token file that does not fit the tokenizer it is read with; the message says why."""


@dataclass(frozen=True, slots=True)
class TokenFileMeta:
    """What the ids of a token file were built with."""

    tokenizer: str  # how to load it again: `mini`, a folder, or a hub id
    tokenizer_name: str
    tokenizer_fingerprint: str  # sha256 of the vocabulary and the added-token table
    format: dict[str, Any]  # the format's name and options

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def tokenizer_spec(tok: Tokenizer) -> str:
    """How to load `tok` again: `mini` for the bundled one, else its folder."""
    from specregen.models.tokenizer import MINI_TOKENIZER_DIR

    if not tok.source:
        return tok.name
    folder = Path(tok.source).resolve()
    return "mini" if folder == MINI_TOKENIZER_DIR.resolve() else str(folder)


def vocabulary_fingerprint(tok: Tokenizer) -> str:
    """The same for the same vocabulary wherever it was loaded from (a folder copy, the hub
    cache): its rank file, else `tokenizer.json`, and the added-token table."""
    digest = hashlib.sha256()
    folder = Path(tok.source) if tok.source else None
    for name in ("tiktoken.model", "tokenizer.json"):
        if folder is not None and (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
            break
    else:
        # No file to hash: the decoded bytes of every ordinary id.
        for token_id in range(tok.base_vocab_size):
            piece = tok.decode_bytes([token_id])
            digest.update(len(piece).to_bytes(4, "big") + piece)
    digest.update(json.dumps(sorted(tok.added_tokens.items())).encode())
    return digest.hexdigest()


def token_file_meta(fmt: ChatFormat, tokenizer: str | None = None) -> TokenFileMeta:
    """The metadata of a file built with `fmt` (`tokenizer`: how the user named it)."""
    if tokenizer is None or Path(tokenizer).expanduser().is_dir():
        tokenizer = tokenizer_spec(fmt.tok)  # a folder: absolute, so it loads from anywhere
    return TokenFileMeta(
        tokenizer=tokenizer,
        tokenizer_name=fmt.tok.name,
        tokenizer_fingerprint=vocabulary_fingerprint(fmt.tok),
        format=fmt.describe(),
    )


def read_token_meta(where: Any) -> TokenFileMeta | None:
    """The metadata of a token file, or None for one written before it existed."""
    metadata = pq.read_schema(where).metadata or {}
    raw = metadata.get(META_KEY)
    if raw is None:
        return None
    try:
        return TokenFileMeta(**json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise TokenFileError(f"{where}: unreadable specregen metadata ({exc})") from None


def check_tokenizer_matches(meta: TokenFileMeta, tok: Tokenizer, where: Any) -> None:
    """Refuse a tokenizer other than the one the file's ids were built with."""
    if vocabulary_fingerprint(tok) != meta.tokenizer_fingerprint:
        raise TokenFileError(
            f"{where} was built with tokenizer {meta.tokenizer_name!r} ({meta.tokenizer}), and "
            f"tokenizer {tok.name!r} ({tok.source or tok.name}) has another vocabulary "
            f"(fingerprint {vocabulary_fingerprint(tok)[:12]} vs "
            f"{meta.tokenizer_fingerprint[:12]}); leave --tokenizer out to use the file's own"
        )


def _schema(base: pa.Schema, meta: TokenFileMeta | None) -> pa.Schema:
    return base if meta is None else base.with_metadata({META_KEY: meta.to_bytes()})


def to_row(sample: TokenSample) -> dict[str, Any]:
    row = asdict(sample)
    for name in _CALL_COLUMNS:
        row[name] = json.dumps(row[name], ensure_ascii=False)
    for name in _JSON_COLUMNS:
        row[name] = None if row[name] is None else json.dumps(row[name], ensure_ascii=False)
    return row


def from_row(row: dict[str, Any]) -> TokenSample:
    values: dict[str, Any] = {name: row.get(name) for name in SCHEMA.names}
    for name in _CALL_COLUMNS:
        values[name] = [ToolCall(**c) for c in json.loads(row.get(name) or "[]")]
    for name in _JSON_COLUMNS:
        values[name] = json.loads(row[name]) if row.get(name) else None
    values["flags"] = list(values["flags"] or [])
    values["input_ids"] = list(values["input_ids"] or [])
    values["loss_mask"] = list(values["loss_mask"] or [])
    return TokenSample(**values)


def write_token_samples(
    samples: Iterable[TokenSample], where: Any, meta: TokenFileMeta | None = None
) -> int:
    """Write samples to a parquet file (a path or an open binary file); returns the row count.
    `meta` (from `token_file_meta`) records the tokenizer and format in the schema."""
    count = 0
    schema = _schema(SCHEMA, meta)
    with pq.ParquetWriter(where, schema) as writer:
        batch: list[dict[str, Any]] = []
        for sample in samples:
            batch.append(to_row(sample))
            if len(batch) >= ROW_GROUP_SIZE:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count


def read_token_samples(where: Any) -> Iterator[TokenSample]:
    """Samples back from a parquet file, one row group at a time."""
    for batch in pq.ParquetFile(where).iter_batches(batch_size=ROW_GROUP_SIZE):
        for row in batch.to_pylist():
            yield from_row(row)


QUARANTINE_SCHEMA = SCHEMA.append(pa.field("reasons", pa.list_(pa.string())))


def token_samples_bytes(
    samples: list[TokenSample], reasons: list[list[str]] | None = None,
    meta: TokenFileMeta | None = None,
) -> bytes:
    """A whole parquet file in memory (one chunk's worth), with `reasons` when given."""
    import io

    rows = [to_row(s) for s in samples]
    schema = _schema(SCHEMA, meta)
    if reasons is not None:
        schema = _schema(QUARANTINE_SCHEMA, meta)
        for row, why in zip(rows, reasons, strict=True):
            row["reasons"] = why
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    return buffer.getvalue()

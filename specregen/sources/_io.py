"""Reading source files row by row, whatever their format and wherever they live.

Sources are opened through fsspec, so a local path, `s3://…` (s3fs) and `hf://…` (huggingface_hub)
all work, and `.gz`/`.bz2`/`.xz`/`.zst` are decompressed on the fly. Every reader streams: a
271 MB JSON array is decoded element by element, never loaded whole.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

import fsspec

Format = Literal["json_array", "jsonl", "parquet"]

CHUNK_BYTES = 1 << 20
# One array element bigger than this means the array is broken (or not what we think): stop
# rather than keep reading the rest of a huge file into memory looking for the element's end.
MAX_ELEMENT_CHARS = 64 << 20
_PARQUET_EXTENSIONS = (".parquet", ".pq")
_COMPRESSION_EXTENSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SNIFF_BYTES = 4096


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row as read from the file: a decoded value, or the reason it could not be decoded."""

    label: str  # "file.json#12": file name and 0-based row (JSONL: line) number
    value: Any = None
    error: str | None = None
    raw: str = ""  # the undecodable text, so a reject can still get a content id


class SeenIds:
    """The sample ids seen so far, for duplicate detection over a whole source.

    Each id is kept as 8 bytes of its blake2b digest in an open-addressing table of unsigned
    64-bit slots at most 5/8 full: 13-26 bytes per id with the table growing by doubling (a
    Python set of 12-byte digests costs ~75 B per id: 375 MB at 5M rows; this is <= 134 MB, 67
    MB right after a doubling, and no object per id for the garbage collector). Two different
    ids collide with probability ~n^2 / 2^65: about 1e-6 over 5M rows.
    """

    __slots__ = ("_count", "_mask", "_slots")

    def __init__(self, capacity: int = 1 << 12) -> None:
        size = 1 << max(4, (capacity - 1).bit_length())
        self._slots = array("Q", bytes(8 * size))  # 0 marks an empty slot
        self._mask = size - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, sample_id: str) -> bool:
        """Record `sample_id`; False when it was already there."""
        digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest()
        key = int.from_bytes(digest, "little") or 1
        if not self._insert(key):
            return False
        self._count += 1
        if self._count * 8 > len(self._slots) * 5:
            self._grow()
        return True

    def _insert(self, key: int) -> bool:
        slots, mask = self._slots, self._mask
        i = key & mask
        while True:
            current = slots[i]
            if current == 0:
                slots[i] = key
                return True
            if current == key:
                return False
            i = (i + 1) & mask

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        self._mask = len(self._slots) - 1
        for key in old:
            if key:
                self._insert(key)

    def nbytes(self) -> int:
        return len(self._slots) * self._slots.itemsize


def source_name(source: str) -> str:
    """The file name part of a path or URL, used in row labels."""
    return source.rstrip("/").rsplit("/", 1)[-1] or source


def _without_compression_suffix(name: str) -> str:
    lowered = name.lower()
    for suffix in _COMPRESSION_EXTENSIONS:
        if lowered.endswith(suffix):
            return lowered[: -len(suffix)]
    return lowered


def detect_format(source: str, head: bytes) -> Format:
    """Parquet by extension or magic bytes; otherwise the first non-space byte decides.

    `.json` files on the hub are sometimes JSONL, so JSON-family extensions are not trusted.
    """
    if _without_compression_suffix(source_name(source)).endswith(_PARQUET_EXTENSIONS):
        return "parquet"
    if head.startswith(b"PAR1"):
        return "parquet"
    stripped = head.removeprefix(codecs.BOM_UTF8).lstrip()
    return "json_array" if stripped.startswith(b"[") else "jsonl"


def iter_rows(source: str, *, chunk_bytes: int = CHUNK_BYTES) -> Iterator[SourceRow]:
    """The rows of `source` in file order; a row that cannot be decoded comes with `error` set."""
    name = source_name(source)
    with fsspec.open(source, "rb", compression="infer") as stream:
        fmt = detect_format(source, _sniff(stream))
        if fmt == "parquet":
            yield from iter_parquet(stream, name)
        elif fmt == "json_array":
            yield from iter_json_array(stream, name, chunk_bytes=chunk_bytes)
        else:
            yield from iter_jsonl(stream, name)


def _sniff(stream: IO[bytes]) -> bytes:
    head = stream.read(_SNIFF_BYTES)
    # Skip leading whitespace beyond the first block so detection sees a real byte.
    while head and not head.strip() and len(head) < MAX_ELEMENT_CHARS:
        more = stream.read(_SNIFF_BYTES)
        if not more:
            break
        head += more
    stream.seek(0)
    return head


def iter_jsonl(stream: IO[bytes], name: str) -> Iterator[SourceRow]:
    for number, line in enumerate(stream):
        label = f"{name}#{number}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raw = line.decode("utf-8", errors="replace")
            yield SourceRow(label, error=f"line is not valid UTF-8: {err}", raw=raw)
            continue
        if number == 0:
            text = text.removeprefix("\ufeff")
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            yield SourceRow(label, error=f"line is not valid JSON: {err}", raw=text)
            continue
        yield SourceRow(label, value=value)


def iter_parquet(stream: IO[bytes], name: str, *, batch_rows: int = 512) -> Iterator[SourceRow]:
    import pyarrow.parquet as pq

    number = 0
    parquet = pq.ParquetFile(stream)
    for batch in parquet.iter_batches(batch_size=batch_rows):
        for value in batch.to_pylist():
            yield SourceRow(f"{name}#{number}", value=value)
            number += 1


def iter_json_array(
    stream: IO[bytes], name: str, *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[SourceRow]:
    """Elements of a top-level JSON array, decoded one at a time from chunks of the stream.

    A syntax error inside an array leaves no reliable place to resume, so it ends the iteration
    with one error row that says where the array broke.
    """
    reader = _ChunkedText(stream, chunk_bytes)
    decoder = json.JSONDecoder()
    index = 0
    while True:
        label = f"{name}#{index}"
        try:
            step = _next_element(reader, decoder, first=index == 0)
        except UnicodeDecodeError as err:
            step = f"not valid UTF-8: {err}"
        if step is None:
            return
        if isinstance(step, str):
            yield _array_error(reader, label, step)
            return
        yield SourceRow(label, value=step[0])
        index += 1


def _next_element(
    reader: _ChunkedText, decoder: json.JSONDecoder, *, first: bool
) -> tuple[Any] | str | None:
    """The next element (in a 1-tuple, as it may be null), None at the end, or a problem."""
    if not reader.skip_space():
        return None if first else "the array is not closed (file ends early)"
    if first:
        if reader.peek() != "[":
            return "the file does not start with '['"
        reader.advance(1)
        if not reader.skip_space():
            return "the array is not closed (file ends early)"
    if reader.peek() == "]":
        reader.advance(1)
        return "text after the closing ']'" if reader.skip_space() else None
    if not first:
        if reader.peek() != ",":
            return "expected ',' or ']' between elements"
        reader.advance(1)
        if not reader.skip_space():
            return "the array is not closed (file ends early)"
    decoded = reader.decode(decoder)
    return decoded if isinstance(decoded, str) else (decoded[0],)


def _array_error(reader: _ChunkedText, label: str, problem: str) -> SourceRow:
    snippet = reader.snippet()
    return SourceRow(
        label,
        error=f"JSON array broken at character {reader.offset}: {problem}; "
        f"the rest of the file cannot be read",
        raw=snippet,
    )


class _ChunkedText:
    """A text window over a byte stream: decoded UTF-8, refilled on demand, consumed from the left.

    The only state the array reader needs; kept as a tiny class because the buffer, its
    position and the absolute offset change together.
    """

    def __init__(self, stream: IO[bytes], chunk_bytes: int) -> None:
        self._stream = stream
        self._chunk = chunk_bytes
        # utf-8-sig drops a BOM; the incremental decoder keeps multi-byte characters that
        # straddle chunk boundaries intact.
        self._utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        self._buf = ""
        self._pos = 0
        self._dropped = 0
        self._eof = False

    @property
    def offset(self) -> int:
        return self._dropped + self._pos

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._stream.read(self._chunk)
        self._eof = not data
        # Keep only the unread text, so memory stays at about one chunk plus one element.
        self._dropped += self._pos
        self._buf = self._buf[self._pos :] + self._utf8.decode(data, final=self._eof)
        self._pos = 0
        return bool(data)

    def skip_space(self) -> bool:
        """Skip whitespace; False when the text ends."""
        while True:
            match = _WHITESPACE.match(self._buf, self._pos)
            self._pos = match.end() if match else self._pos
            if self._pos < len(self._buf):
                return True
            if not self._fill() and self._pos >= len(self._buf):
                return False

    def peek(self) -> str:
        return self._buf[self._pos]

    def advance(self, n: int) -> None:
        self._pos += n

    def snippet(self, chars: int = 200) -> str:
        return self._buf[self._pos : self._pos + chars]

    def decode(self, decoder: json.JSONDecoder) -> tuple[Any, int] | str:
        """The next JSON value, or a message saying why it cannot be decoded."""
        while True:
            try:
                value, end = decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                if self._eof:
                    self._pos = err.pos
                    return f"not valid JSON: {err.msg}"
                if len(self._buf) - self._pos > MAX_ELEMENT_CHARS:
                    return f"an element longer than {MAX_ELEMENT_CHARS} characters"
                self._fill()
                continue
            # A number can end exactly where the buffer does while more digits are still
            # unread; re-decoding with more text settles it (and costs nothing for objects).
            if end == len(self._buf) and not self._eof:
                self._fill()
                continue
            self._pos = end
            return value, end

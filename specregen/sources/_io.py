"""Reading source files row by row, whatever their format and wherever they live.

Sources are opened through fsspec, so a local path, `s3://…` (s3fs) and `hf://…` (huggingface_hub)
all work, and `.gz`/`.bz2`/`.xz`/`.zst` are decompressed on the fly. Every reader streams: a
271 MB JSON array is decoded element by element, never loaded whole.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
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
    """The sample ids seen so far, for duplicate detection over a whole source, in bounded
    memory.

    Each id is kept as 8 bytes of its blake2b digest in an open-addressing table of unsigned
    64-bit slots at most 5/8 full (13-26 B per id, growing by doubling; a Python set of 12-byte
    digests costs ~75 B per id: 375 MB at 5M rows). Past `memory_ids` ids the table's keys are
    sorted into a temporary file (a run) and the table starts again small; a fixed-size Bloom
    filter (`bloom_bytes`, made at the first spill) holds every spilled key, and only an id it
    may have seen is looked up in the runs on disk (binary search with pread). Memory stays
    below 16 * memory_ids + bloom_bytes (~24 MB by default) at any row count; the runs take 8 B per
    spilled id on disk. Two different ids collide with probability ~n^2 / 2^65: about 1e-6
    over 5M rows.
    """

    __slots__ = ("_bloom", "_bloom_bits", "_capacity", "_count", "_limit", "_mask", "_runs",
                 "_slots", "_table_count")

    def __init__(self, capacity: int = 1 << 12, memory_ids: int = 1 << 20,
                 bloom_bytes: int = 8 << 20) -> None:
        self._capacity = capacity
        self._limit = max(16, memory_ids)
        self._count = 0
        self._runs: list[tuple[Any, int]] = []  # (open temporary file, keys in it)
        # Made at the first spill: a source that fits in the table never pays for it.
        self._bloom = bytearray()
        self._bloom_bits = max(64, bloom_bytes) * 8
        self._reset_table()

    def _reset_table(self) -> None:
        size = 1 << max(4, (self._capacity - 1).bit_length())
        self._slots = array("Q", bytes(8 * size))  # 0 marks an empty slot
        self._mask = size - 1
        self._table_count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, sample_id: str) -> bool:
        """Record `sample_id`; False when it was already there."""
        digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest()
        key = int.from_bytes(digest, "little") or 1
        if self._runs and self._in_runs(key):
            return False
        if not self._insert(key):
            return False
        self._count += 1
        self._table_count += 1
        if self._table_count >= self._limit:
            self._spill()
        elif self._table_count * 8 > len(self._slots) * 5:
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

    # -- past memory_ids: sorted runs on disk behind a Bloom filter -------------------------

    def _bloom_positions(self, key: int) -> tuple[int, ...]:
        # Double hashing over the digest's two halves (the digest is already uniform).
        low, high = key & 0xFFFFFFFF, (key >> 32) | 1
        return tuple((low + i * high) % self._bloom_bits for i in range(4))

    def _in_runs(self, key: int) -> bool:
        bloom = self._bloom
        for pos in self._bloom_positions(key):
            if not bloom[pos >> 3] & (1 << (pos & 7)):
                return False
        return any(_run_contains(handle, n, key) for handle, n in self._runs)

    def _spill(self) -> None:
        import tempfile

        import numpy as np

        # numpy: no Python object per key on the way out (a list of 1M ints is ~36 MB).
        table = np.frombuffer(self._slots, dtype=np.uint64)
        keys = np.sort(table[table != 0])
        handle = tempfile.TemporaryFile(prefix="specregen-seen-")  # noqa: SIM115 (kept open)
        keys.astype("<u8").tofile(handle)
        handle.flush()
        self._runs.append((handle, len(keys)))
        if not self._bloom:
            self._bloom = bytearray(self._bloom_bits // 8)
        bloom = np.frombuffer(self._bloom, dtype=np.uint8)
        low, high = keys & np.uint64(0xFFFFFFFF), (keys >> np.uint64(32)) | np.uint64(1)
        for i in range(4):  # the positions of _bloom_positions, all keys at once
            pos = (low + np.uint64(i) * high) % np.uint64(self._bloom_bits)
            bits = np.left_shift(1, (pos & np.uint64(7)).astype(np.uint8)).astype(np.uint8)
            np.bitwise_or.at(bloom, (pos >> np.uint64(3)).astype(np.int64), bits)
        del table, bloom
        self._reset_table()

    def close(self) -> None:
        """Remove the runs on disk (also done when the object is collected)."""
        for handle, _ in self._runs:
            handle.close()
        self._runs = []

    def nbytes(self) -> int:
        """Bytes held in memory: the table and the Bloom filter."""
        return len(self._slots) * self._slots.itemsize + len(self._bloom)


def _run_contains(handle: Any, n: int, key: int) -> bool:
    """Binary search of a sorted run of little-endian uint64 keys, read 8 bytes at a time."""
    fd = handle.fileno()
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        value = int.from_bytes(os.pread(fd, 8, mid * 8), "little")
        if value == key:
            return True
        if value < key:
            lo = mid + 1
        else:
            hi = mid
    return False


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
            # Without the newline: a line cut short is reported where it ends, not at
            # "line 2 column 1" after it.
            value = json.loads(text.rstrip("\r\n"))
        except json.JSONDecodeError as err:
            yield SourceRow(label, error=f"line is not valid JSON: {err.msg} at column"
                            f" {err.pos + 1}", raw=text)
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

"""One JSONL file written line by line, shard after shard, that readers never see half done.

Locally it is written under a temporary name, fsynced and renamed; on object stores fsspec's
writer uploads in parts and the object appears only when it is closed. The sha256 and the row
count are taken as the bytes go out, so nothing is read back or held in memory.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from types import TracebackType
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from specregen.store.fs import _fsync_dir

# Lines are buffered to about this many bytes before a write.
_FLUSH_BYTES = 1 << 20


class JsonlWriter:
    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.rows = 0
        self._digest = hashlib.sha256()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._local = isinstance(fs, LocalFileSystem)
        if self._local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            self._handle: Any = open(self._tmp, "wb")  # noqa: SIM115 (closed in close/abort)
        else:
            self._tmp = path
            self._handle = fs.open(path, "wb")

    def write(self, line: str) -> None:
        data = line.encode() + b"\n"
        self._buffer.append(data)
        self._buffered += len(data)
        self.rows += 1
        if self._buffered >= _FLUSH_BYTES:
            self._drain()

    def _drain(self) -> None:
        data = b"".join(self._buffer)
        self._digest.update(data)
        self._handle.write(data)
        self._buffer.clear()
        self._buffered = 0

    def close(self) -> str:
        """Finish the file; returns its sha256."""
        self._drain()
        if self._local:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            os.replace(self._tmp, self.path)
            _fsync_dir(os.path.dirname(self.path))
        else:
            self._handle.close()
        return self._digest.hexdigest()

    def abort(self) -> None:
        try:
            if self._local:
                self._handle.close()
                os.unlink(self._tmp)
            else:
                # An unfinished multipart upload is discarded rather than completed.
                discard = getattr(self._handle, "discard", None)
                if callable(discard):
                    discard()
                else:
                    self._handle.close()
        except OSError:
            pass

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.abort()

"""One storage root, local or remote (fsspec), with writes a reader never sees half done.

Local files are written under a temporary name, fsynced and renamed; object stores put each
object in one request, which is atomic there.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


@dataclass(frozen=True)
class Store:
    """A storage root: `/data/run`, `s3://bucket/prefix`, `memory://x` ..."""

    url: str

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.core.url_to_fs(self.url)[0]

    @property
    def root(self) -> str:
        return fsspec.core.url_to_fs(self.url)[1].rstrip("/")

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def url_of(self, *parts: str) -> str:
        """A full URL for a path under the root (what another process or reader needs)."""
        protocol = self.fs.protocol
        protocol = protocol[0] if isinstance(protocol, tuple) else protocol
        path = self.path(*parts)
        return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.path(*parts))

    def write_bytes(self, data: bytes, *parts: str) -> str:
        """Write atomically; returns the sha256 of what was written."""
        write_atomic(self.fs, self.path(*parts), data)
        return hashlib.sha256(data).hexdigest()

    def read_bytes(self, *parts: str) -> bytes:
        with self.fs.open(self.path(*parts), "rb") as handle:
            return handle.read()

    def write_json(self, value: Any, *parts: str) -> str:
        data = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True).encode()
        return self.write_bytes(data + b"\n", *parts)

    def read_json(self, *parts: str) -> Any:
        return json.loads(self.read_bytes(*parts))

    def list(self, *parts: str) -> list[str]:
        """Names (not paths) directly under a folder; empty when it does not exist."""
        folder = self.path(*parts)
        if not self.fs.exists(folder):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(folder, detail=False))


def make_dirs(folder: str | os.PathLike[str]) -> None:
    """`os.makedirs(exist_ok=True)`, but a regular file in the way is ENOTDIR (what it means),
    not EEXIST."""
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError as exc:
        raise NotADirectoryError(
            errno.ENOTDIR, "a regular file is in the way", exc.filename
        ) from None


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    if isinstance(fs, LocalFileSystem):
        folder = os.path.dirname(path)
        make_dirs(folder)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            # A full disk or a kill mid-write must not leave a half file behind.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(folder)
        return
    # Object stores: a single put is atomic; there are no folders to create.
    fs.pipe_file(path, data)


def _fsync_dir(folder: str) -> None:
    # The rename itself is durable only once the folder entry is on disk.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

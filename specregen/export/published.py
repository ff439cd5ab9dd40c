"""A publication read back from storage, for exports of publications made before they existed.

`PUBLISHED_DIR` is `{storage}/{dataset}/published/{fp}` (or its parent, whose LATEST.json names
the newest). The raw log of `{storage}/{dataset}/rawlog/` fills in usage, provider and model when
it is still there; which chunk each data shard came from is in the manifest (`chunks`), or, for
older publications, follows from the gate manifest they were copied from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec

from specregen.errors import UsageError
from specregen.export.rows import RunMeta
from specregen.export.runmeta import chunk_run_meta
from specregen.export.writer import ExportShard, chunk_of

MANIFEST = "manifest.json"


class PublicationError(UsageError, ValueError):
    """Not a publication folder, or one whose shards do not match its manifest."""


@dataclass
class Publication:
    fs: fsspec.AbstractFileSystem
    folder: str  # fs path of published/{fp}
    manifest: dict[str, Any]
    chunks: list[int | None] = field(default_factory=list)

    @property
    def dataset(self) -> str:
        return str(self.manifest.get("dataset") or "")

    @property
    def data_shards(self) -> list[dict[str, Any]]:
        return [s for s in self.manifest.get("shards", []) if s["path"].endswith(".parquet")]

    @property
    def dataset_root(self) -> str:
        # published/{fp} -> the dataset folder
        return self.folder.rsplit("/", 2)[0]

    def url(self, path: str) -> str:
        protocol = self.fs.protocol
        protocol = protocol[0] if isinstance(protocol, tuple) else protocol
        return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

    def shards(self) -> Iterator[ExportShard]:
        """Each data shard's bytes, checked against the manifest's sha256."""
        import hashlib

        for shard, chunk in zip(self.data_shards, self.chunks, strict=True):
            with self.fs.open(f"{self.folder}/{shard['path']}", "rb") as handle:
                data = handle.read()
            if hashlib.sha256(data).hexdigest() != shard["sha256"]:
                raise PublicationError(
                    f"{self.folder}/{shard['path']}: sha256 differs from the manifest's"
                )
            yield ExportShard(parquet=data, chunk=chunk)

    def run_meta(self, shard: ExportShard, ids: list[str]) -> dict[str, RunMeta]:
        if shard.chunk is None:
            return {}
        rawlog = f"{self.dataset_root}/rawlog/chunk-{shard.chunk:05d}"
        if not self.fs.exists(rawlog):
            return {}
        return chunk_run_meta(self.url(rawlog), ids)


def open_publication(url: str) -> Publication:
    fs, path = fsspec.core.url_to_fs(url)
    folder = path.rstrip("/")
    if not fs.exists(f"{folder}/{MANIFEST}") and fs.exists(f"{folder}/LATEST.json"):
        latest = _read_json(fs, f"{folder}/LATEST.json")
        folder = f"{folder}/{latest['fingerprint']}"
    if not fs.exists(f"{folder}/{MANIFEST}"):
        raise PublicationError(
            f"{url}: no {MANIFEST} (give a published/<fingerprint> folder or published/)"
        )
    manifest = _read_json(fs, f"{folder}/{MANIFEST}")
    if manifest.get("stage") != "published":
        raise PublicationError(f"{url}: the manifest is of stage {manifest.get('stage')!r}")
    pub = Publication(fs=fs, folder=folder, manifest=manifest)
    pub.chunks = _chunks(pub)
    return pub


def _chunks(pub: Publication) -> list[int | None]:
    count = len(pub.data_shards)
    recorded = pub.manifest.get("extra", {}).get("chunks")
    if isinstance(recorded, list) and len(recorded) == count:
        return [c if isinstance(c, int) and c >= 0 else None for c in recorded]
    # Older publications were copied from the gate's accepted shards in order, skipping empty
    # ones, and named by the gate's fingerprint.
    gate_fp = pub.manifest.get("extra", {}).get("gate_fingerprint") or pub.manifest["fingerprint"]
    gate_manifest = f"{pub.dataset_root}/gate/{gate_fp}/{MANIFEST}"
    if pub.fs.exists(gate_manifest):
        gated = _read_json(pub.fs, gate_manifest)
        accepted = [s["path"] for s in gated.get("shards", [])
                    if s["path"].startswith("accepted/") and s.get("rows")]
        if len(accepted) == count:
            return [chunk_of(p) for p in accepted]
    return [None] * count


def _read_json(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any]:
    with fs.open(path, "rb") as handle:
        return json.loads(handle.read())

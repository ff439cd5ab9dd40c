"""Stage manifests: the source of truth for "this stage of this dataset is done".

A stage is done exactly when `{dataset}/{stage}/{fingerprint}/manifest.json` exists. The
fingerprint covers everything the stage's output depends on, so a changed tokenizer or changed
reconstruction code gives a new fingerprint and the stage runs again (from the raw log, without
paying for new requests).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specregen.fingerprint import fingerprint as content_fingerprint
from specregen.store.fs import Store

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Shard:
    path: str  # relative to the stage folder
    rows: int
    sha256: str


@dataclass
class StageManifest:
    dataset: str
    stage: str
    fingerprint: str
    counts: dict[str, int] = field(default_factory=dict)
    shards: list[Shard] = field(default_factory=list)
    finished_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> StageManifest:
        shards = [Shard(**s) for s in value.get("shards", [])]
        return cls(**{**value, "shards": shards})


def stage_parts(dataset: str, stage: str, fingerprint: str, *rest: str) -> tuple[str, ...]:
    return (dataset, stage, fingerprint, *rest)


def write_manifest(store: Store, manifest: StageManifest) -> None:
    if not manifest.finished_at:
        manifest.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    parts = stage_parts(manifest.dataset, manifest.stage, manifest.fingerprint, MANIFEST)
    store.write_json(manifest.to_json(), *parts)


def read_manifest(store: Store, dataset: str, stage: str, fingerprint: str) -> StageManifest | None:
    parts = stage_parts(dataset, stage, fingerprint, MANIFEST)
    if not store.exists(*parts):
        return None
    return StageManifest.from_json(store.read_json(*parts))


def fingerprint(*values: Any) -> str:
    """A short stable hash of JSON-able values (dict key order does not matter)."""
    return content_fingerprint(list(values))[:16]


def files_fingerprint(paths: list[Path]) -> str:
    """The hash of files' contents: the code or tokenizer a stage's output depends on."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]

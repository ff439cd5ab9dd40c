"""The bodies of the chain's stages that both runners share: the library runner
(`pipeline/run.py`) calls them directly, the Prefect tasks (`tasks/`) wrap them with artifacts
and retries. Each returns its outcome as JSON-able data (a task's result crosses Prefect), and
raises only when it cannot have one (chain.py: one failure protocol)."""

from __future__ import annotations

from typing import Any

from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.gating import GateVerdict, gate_dataset
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.publish import publish_dataset, publish_fp, published
from specregen.pipeline.reconstruction import STAGE as RECONSTRUCT
from specregen.progress import Progress
from specregen.store.manifest import StageManifest, read_manifest


def published_step(run: DatasetRun) -> dict[str, Any] | None:
    """The published manifest's fingerprint and counts when this exact dataset run is
    already published, else None (the chain then runs)."""
    manifest = published(run)
    return None if manifest is None else {"fingerprint": manifest.fingerprint, **manifest.counts}


def reconstructed_manifest(run: DatasetRun) -> StageManifest:
    """What the gate reads: reconstruction's manifest, which the chain wrote just before."""
    manifest = read_manifest(run.store, run.name, RECONSTRUCT, run.reconstruct_fp)
    if manifest is None:
        raise RuntimeError(f"{run.name}: reconstruction has no manifest; it did not finish")
    return manifest


def gate_step(run: DatasetRun, progress: Progress | None = None) -> dict[str, Any]:
    """The gate over the reconstructed shards: its verdict (`passed`, `verdict`, `why`) and
    counts. A failing dataset is an outcome here, not an error (read it with
    `GateVerdict.of_extra`)."""
    gated = gate_dataset(run, reconstructed_manifest(run), progress)
    return {**gated.counts, **GateVerdict.of(gated).to_extra()}


def publish_step(run: DatasetRun) -> dict[str, Any]:
    """Publish the gate's accepted shards (the chain calls it only after a pass); where they
    went and their counts."""
    gated = read_manifest(run.store, run.name, GATE, run.gate_fp)
    if gated is None:
        raise RuntimeError(f"{run.name}: the gate has not run; nothing is published without it")
    manifest = publish_dataset(run, gated)
    return {"path": run.store.url_of(run.name, "published", publish_fp(run)), **manifest.counts}

"""Stage `publish`: the accepted shards of a dataset that passed its gate, with sha256 manifest.

The published `data/` folder is read by `pyarrow.dataset` and `datasets.load_dataset("parquet")`;
`LATEST.json` beside it names the newest publication. Beside `data/`, `train.jsonl` holds one
row per sample with the exact ids and unshifted loss mask that speculators and SpecForge read
without tokenizing again; the optional `messages.jsonl` holds text conversations (lossy: a
trainer tokenizes them again). Both are written shard by shard, so memory does not grow with the
dataset. The publication's fingerprint covers the gate's and the export options, so turning an
export on publishes the dataset again.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from specregen.client.request import build_request
from specregen.config import PipelineConfig
from specregen.errors import PartialFailureError
from specregen.export.context import context_from_metadata
from specregen.export.rows import ExportContext, RunMeta
from specregen.export.runmeta import chunk_run_meta
from specregen.export.writer import (
    EXPORT_FILES,
    EXPORT_NOTES,
    ExportKind,
    ExportShard,
    chunk_of,
    parquet_metadata,
    write_exports,
)
from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.layout import DatasetRun, chunk_name, tokenizer_fingerprint
from specregen.pipeline.prompts import read_chunk
from specregen.pipeline.reconstruction import run_format
from specregen.store.manifest import (
    Shard,
    StageManifest,
    fingerprint,
    read_manifest,
    write_manifest,
)
from specregen.wire.request import request_fingerprint

STAGE = "published"
# Bumped when the export rows change shape, so publications are written again.
EXPORT_VERSION = 1


class GateFailedError(PartialFailureError, RuntimeError):
    """The dataset did not pass its gate: nothing of it is published (the other datasets of
    the run go on, hence a partial failure). The message names the dataset and the gate's
    reasons; the gate folder's report.md lists the quarantined samples."""


def export_kinds(config: PipelineConfig) -> list[ExportKind]:
    kinds: list[ExportKind] = []
    if config.export_train:
        kinds.append("train")
    if config.export_messages or config.export_specforge:
        kinds.append("messages")
    return kinds


def publish_fp(run: DatasetRun) -> str:
    return fingerprint("publish", run.gate_fp, export_kinds(run.config), EXPORT_VERSION)


def published(run: DatasetRun) -> StageManifest | None:
    return read_manifest(run.store, run.name, STAGE, publish_fp(run))


def publish_dataset(run: DatasetRun, gated: StageManifest) -> StageManifest:
    done = published(run)
    if done is not None:
        return done
    verdict = GateVerdict.of(gated)
    if not verdict.passed:
        why = "; ".join(verdict.why or ["the gate failed"])
        raise GateFailedError(f"{run.name}: not published: {why}")
    fp = publish_fp(run)
    shards: list[Shard] = []
    chunks: list[int] = []

    def copied() -> Iterator[ExportShard]:
        # Gate shard `accepted/chunk-0000K.parquet` holds the samples of chunk K.
        for shard in gated.shards:
            if not shard.path.startswith("accepted/") or shard.rows == 0:
                continue
            data = run.store.read_bytes(run.name, GATE, run.gate_fp, shard.path)
            # Parquet alone in data/: pyarrow.dataset and datasets.load_dataset read the folder.
            name = f"data/data-{len(shards):05d}.parquet"
            digest = run.store.write_bytes(data, run.name, STAGE, fp, *name.split("/"))
            shards.append(Shard(path=name, rows=shard.rows, sha256=digest))
            chunk = chunk_of(shard.path)
            chunks.append(chunk if chunk is not None else -1)
            yield ExportShard(parquet=data, chunk=chunk)

    kinds = export_kinds(run.config)
    fallback = ExportContext(
        dataset=run.name,
        # Shards record their format (`specregen` metadata); one that does not was built
        # with the run's.
        format=run.config.format_name,
        tokenizer=run.config.tokenizer,
        tokenizer_fingerprint=tokenizer_fingerprint(run.config.tokenizer),
        model=run.config.endpoint.model,
    )
    if kinds:
        exports = write_exports(
            run.store.fs, run.store.path(run.name, STAGE, fp), copied(), kinds,
            context=lambda shard: context_from_metadata(parquet_metadata(shard.parquet),
                                                        fallback),
            decode=run_format(run).tok.decode,
            run_meta=partial(_run_meta, run),
        )
    else:
        exports = []
        for _ in copied():
            pass
    manifest = StageManifest(
        dataset=run.name, stage=STAGE, fingerprint=fp,
        counts={"samples": sum(s.rows for s in shards)},
        shards=[*shards, *exports],
        extra={
            "tokenizer": run.config.tokenizer, "model": run.config.endpoint.model,
            "format": run.config.format_name,
            "gate_fingerprint": run.gate_fp, "chunks": chunks,
            "exports": {EXPORT_FILES[k]: EXPORT_NOTES[k] for k in kinds},
        },
    )
    write_manifest(run.store, manifest)
    run.store.write_json({"fingerprint": fp, "manifest": f"{fp}/manifest.json"},
                         run.name, STAGE, "LATEST.json")
    return manifest


def _run_meta(run: DatasetRun, shard: ExportShard, ids: list[str]) -> dict[str, RunMeta]:
    if shard.chunk is None or not run.store.exists(run.name, "rawlog", chunk_name(shard.chunk)):
        return {}
    # Only the answer reconstruction used: the one whose request is today's.
    wanted = set(ids)
    fingerprints = {
        p.sample_id: request_fingerprint(build_request(p, run.config.endpoint))
        for p in read_chunk(run, shard.chunk) if p.sample_id in wanted
    }
    return chunk_run_meta(run.rawlog_url(shard.chunk), ids, fingerprints)

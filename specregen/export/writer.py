"""Write a publication's exports from its parquet shards, one shard at a time.

Each shard is read row group by row group and its rows go straight into the one open file per
export, so memory depends on the shard size, never on the dataset's.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import fsspec
import pyarrow.parquet as pq

from specregen.export.jsonl import JsonlWriter
from specregen.export.rows import ExportContext, RunMeta, dumps, messages_row, train_row
from specregen.store.manifest import Shard
from specregen.store.token_samples import read_token_samples

ExportKind = Literal["train", "messages"]
EXPORT_FILES: dict[ExportKind, str] = {"train": "train.jsonl", "messages": "messages.jsonl"}
# What each export keeps: the manifest and the `export` command say it in these words.
EXPORT_NOTES: dict[ExportKind, str] = {
    "train": "exact: input_ids and loss_mask as published, read unchanged by speculators "
             "(prepare_data) and SpecForge (data.prompts_path)",
    "messages": "LOSSY: text conversations; a trainer that renders and tokenizes them again "
                "may train on other ids than the published ones",
}


@dataclass(frozen=True, slots=True)
class ExportShard:
    """One published parquet shard and the raw-log chunk its answers came from (if known)."""

    parquet: bytes
    chunk: int | None = None


RunMetaLookup = Callable[[ExportShard, list[str]], dict[str, RunMeta]]


def chunk_of(path: str) -> int | None:
    """The chunk index in a shard name like `accepted/chunk-00003.parquet`."""
    stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
    if stem.startswith("chunk-") and stem[6:].isdigit():
        return int(stem[6:])
    return None


def parquet_metadata(data: bytes) -> dict[str, str]:
    """The key/value metadata of a token-sample parquet schema (tokenizer, format ...)."""
    raw = pq.ParquetFile(io.BytesIO(data)).schema_arrow.metadata or {}
    out: dict[str, str] = {}
    for key, value in raw.items():
        name = key.decode(errors="replace")
        if name.startswith("ARROW:") or name == "pandas":
            continue
        out[name] = value.decode(errors="replace")
    return out


def sample_ids(data: bytes) -> list[str]:
    return pq.read_table(io.BytesIO(data), columns=["sample_id"]).column(0).to_pylist()


def write_exports(
    fs: fsspec.AbstractFileSystem,
    folder: str,
    shards: Iterable[ExportShard],
    kinds: Iterable[ExportKind],
    *,
    context: Callable[[ExportShard], ExportContext],
    decode: Callable[[list[int]], str],
    run_meta: RunMetaLookup | None = None,
    names: dict[ExportKind, str] | None = None,
) -> list[Shard]:
    """Write `folder/train.jsonl` and/or `folder/messages.jsonl`; returns their manifest entries.

    `context` gives the dataset-wide row fields for a shard (it may read the shard's parquet
    metadata); `decode` turns ids into the review text; `run_meta` finds usage, provider and
    model of the shard's samples in the raw log; `names` overrides the file names.
    """
    kinds = list(dict.fromkeys(kinds))
    if not kinds:
        return []
    names = {**EXPORT_FILES, **(names or {})}
    writers = {kind: JsonlWriter(fs, f"{folder}/{names[kind]}") for kind in kinds}
    try:
        for shard in shards:
            ctx = context(shard)
            meta: dict[str, RunMeta] = {}
            if "train" in writers and run_meta is not None:
                meta = run_meta(shard, sample_ids(shard.parquet))
            for sample in read_token_samples(io.BytesIO(shard.parquet)):
                if "train" in writers:
                    row = train_row(sample, ctx, decode(sample.input_ids),
                                    meta.get(sample.sample_id))
                    writers["train"].write(dumps(row))
                if "messages" in writers:
                    writers["messages"].write(dumps(messages_row(sample)))
        entries = []
        for kind, writer in writers.items():
            digest = writer.close()
            entries.append(Shard(path=names[kind], rows=writer.rows, sha256=digest))
        return entries
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise

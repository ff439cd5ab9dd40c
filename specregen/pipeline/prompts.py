"""Stage `prompts`: source rows -> Prompt chunks of `chunk_size`, and the rows refused, with why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict

from specregen.pipeline.layout import DatasetRun, chunk_name
from specregen.records import Prompt, SourceReject
from specregen.sources import read_source
from specregen.sources.declared import line_declaration
from specregen.store.manifest import Shard, StageManifest, read_manifest, write_manifest

STAGE = "prompts"


def prepare_prompts(run: DatasetRun) -> StageManifest:
    """Read the source once and write its chunks; a finished stage is returned as it is."""
    done = read_manifest(run.store, run.name, STAGE, run.prompts_fp)
    if done is not None:
        return done
    d = run.dataset
    records = read_source(d.adapter, d.source, dataset=d.name, limit=d.limit,
                          **d.adapter_options)
    shards: list[Shard] = []
    rejects: list[str] = []
    chunk: list[str] = []
    for record in records:
        if isinstance(record, SourceReject):
            rejects.append(json.dumps(asdict(record), ensure_ascii=False))
            continue
        chunk.append(prompt_to_json(record))
        if len(chunk) == run.config.chunk_size:
            shards.append(_write_chunk(run, len(shards), chunk))
            chunk = []
    if chunk:
        shards.append(_write_chunk(run, len(shards), chunk))
    data = "".join(line + "\n" for line in rejects).encode()
    run.store.write_bytes(data, run.name, STAGE, run.prompts_fp, "rejects.jsonl")
    manifest = StageManifest(
        dataset=run.name, stage=STAGE, fingerprint=run.prompts_fp,
        counts={"prompts": sum(s.rows for s in shards), "rejected": len(rejects),
                "chunks": len(shards)},
        shards=shards,
    )
    write_manifest(run.store, manifest)
    return manifest


def _write_chunk(run: DatasetRun, index: int, lines: list[str]) -> Shard:
    name = chunk_name(index) + ".jsonl"
    digest = run.store.write_bytes(("\n".join(lines) + "\n").encode(), run.name, STAGE,
                                   run.prompts_fp, name)
    return Shard(path=name, rows=len(lines), sha256=digest)


def read_chunk(run: DatasetRun, index: int) -> list[Prompt]:
    raw = run.store.read_bytes(run.name, STAGE, run.prompts_fp, chunk_name(index) + ".jsonl")
    return [prompt_from_json(line) for line in raw.decode().splitlines() if line]


def read_rejects(run: DatasetRun) -> Iterator[SourceReject]:
    raw = run.store.read_bytes(run.name, STAGE, run.prompts_fp, "rejects.jsonl")
    for line in raw.decode().splitlines():
        if line:
            yield SourceReject(**json.loads(line))


def prompt_to_json(prompt: Prompt) -> str:
    row = asdict(prompt)
    if prompt.turns == "first":
        del row["turns"]  # the default: first-turn chunks stay byte for byte what they were
    # `declared_tools` is always written (null too): its absence marks a chunk written before
    # adapters stated it. A problem is rare: written only when there is one.
    if prompt.declaration_problem is None:
        del row["declaration_problem"]
    return json.dumps(row, ensure_ascii=False)


def prompt_from_json(line: str) -> Prompt:
    row = json.loads(line)
    # An older chunk's prompt gets the statement its adapter makes today (the same, for every
    # adapter: sources/declared.py), so its samples gate as they did.
    declaration = line_declaration(row)
    row["declared_tools"], row["declaration_problem"] = declaration.tools, declaration.problem
    return Prompt(**row)

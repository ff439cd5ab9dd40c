"""Stage `publish`: the accepted shards of a dataset that passed its gate, with sha256 manifest.

The published `data/` folder is read by `pyarrow.dataset` and `datasets.load_dataset("parquet")`;
`LATEST.json` beside it names the newest publication. An optional SpecForge-style JSONL export
holds the conversations (with `reasoning_content` and `tool_calls`) and the tools.
"""

from __future__ import annotations

import io
import json
from typing import Any

from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.layout import DatasetRun
from specregen.records import TokenSample
from specregen.store.manifest import Shard, StageManifest, read_manifest, write_manifest
from specregen.store.token_samples import read_token_samples

STAGE = "published"


class GateFailedError(RuntimeError):
    """The dataset did not pass its gate: nothing of it is published."""


def published(run: DatasetRun) -> StageManifest | None:
    return read_manifest(run.store, run.name, STAGE, run.gate_fp)


def publish_dataset(run: DatasetRun, gated: StageManifest) -> StageManifest:
    done = published(run)
    if done is not None:
        return done
    if not gated.extra.get("passed"):
        why = "; ".join(gated.extra.get("why") or ["the gate failed"])
        raise GateFailedError(f"{run.name}: not published: {why}")
    shards: list[Shard] = []
    export: list[str] = []
    for shard in gated.shards:
        if not shard.path.startswith("accepted/") or shard.rows == 0:
            continue
        data = run.store.read_bytes(run.name, GATE, run.gate_fp, shard.path)
        # Parquet alone in data/: pyarrow.dataset and datasets.load_dataset read the folder.
        name = f"data/data-{len(shards):05d}.parquet"
        digest = run.store.write_bytes(data, run.name, STAGE, run.gate_fp, *name.split("/"))
        shards.append(Shard(path=name, rows=shard.rows, sha256=digest))
        if run.config.export_specforge:
            export.extend(specforge_line(s) for s in read_token_samples(io.BytesIO(data)))
    if run.config.export_specforge:
        data = "".join(line + "\n" for line in export).encode()
        digest = run.store.write_bytes(data, run.name, STAGE, run.gate_fp, "specforge.jsonl")
        shards.append(Shard(path="specforge.jsonl", rows=len(export), sha256=digest))
    manifest = StageManifest(
        dataset=run.name, stage=STAGE, fingerprint=run.gate_fp,
        counts={"samples": sum(s.rows for s in shards if s.path.endswith(".parquet"))},
        shards=shards,
        extra={"tokenizer": run.config.tokenizer, "model": run.config.endpoint.model},
    )
    write_manifest(run.store, manifest)
    run.store.write_json({"fingerprint": run.gate_fp, "manifest": f"{run.gate_fp}/manifest.json"},
                         run.name, STAGE, "LATEST.json")
    return manifest


def specforge_line(sample: TokenSample) -> str:
    """A SpecForge-style record: the prompt messages plus the regenerated assistant turn."""
    turn: dict[str, Any] = {"role": "assistant", "content": sample.content or ""}
    if sample.reasoning:
        turn["reasoning_content"] = sample.reasoning
    if sample.tool_calls:
        turn["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in sample.tool_calls
        ]
    record: dict[str, Any] = {"id": sample.sample_id,
                              "conversations": [*(sample.messages or []), turn]}
    if sample.tools:
        record["tools"] = sample.tools
    return json.dumps(record, ensure_ascii=False)

"""The report of a pipeline's gate stage, read from its storage (local or an object store)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

from specregen.report.build import ReportData, collect, sum_inference


def stage_report(run: Any, gate: dict[str, Any], shards: list[Any], tok: Any) -> ReportData:
    """`run`: a pipeline DatasetRun; `shards`: the gate manifest's shards (accepted/...,
    quarantined/...); spend from the infer summaries of this prompts x endpoint pair."""

    def sources() -> Iterator[tuple[str, Any, str]]:
        for shard in shards:
            kind = shard.path.split("/", 1)[0]
            data = run.store.read_bytes(run.name, "gate", run.gate_fp, shard.path)
            yield kind, io.BytesIO(data), shard.path

    data = collect(run.name, gate, sources(), tok, inference_spend(run))
    data.notes.insert(0, f"spend: the infer stage's chunk summaries in "
                         f"{'/'.join(_infer_folder(run))}")
    return data


def inference_spend(run: Any) -> dict[str, Any] | None:
    """The infer stage's chunk summaries of this prompts x endpoint pair, summed."""
    folder = _infer_folder(run)
    return sum_inference(json.loads(run.store.read_bytes(*folder, name))
                         for name in run.store.list(*folder) if name.endswith(".json"))


def _infer_folder(run: Any) -> tuple[str, ...]:
    return (run.name, "infer", f"{run.prompts_fp}-{run.endpoint_fp}")

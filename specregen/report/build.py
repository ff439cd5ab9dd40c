"""Where a report's inputs come from: the gate's report.json and shards, and what inference
spent (the infer stage's chunk summaries, or the attempt records of a raw log).

Two layouts are read: `specregen gate --out DIR` (accepted.parquet, quarantined.parquet,
report.json) and a pipeline's gate stage (`{storage}/{dataset}/gate/{fp}/` with accepted/ and
quarantined/ shards; its infer summaries sit at `{storage}/{dataset}/infer/*/`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specregen.conversation.replay import is_context_refusal
from specregen.models.tokenizer import Tokenizer
from specregen.report.stats import DatasetStats, ReportError

# Summed over the infer stage's chunk summaries (client.engine.InferenceSummary fields).
INFERENCE_SUMS = ("ok", "truncated", "failed", "skipped", "requests_sent", "retries",
                  "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost_usd", "wall_s")


@dataclass
class ReportData:
    dataset: str
    gate: dict[str, Any] | None
    stats: DatasetStats
    inference: dict[str, Any] | None = None
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def collect(
    dataset: str,
    gate: dict[str, Any] | None,
    shards: Iterable[tuple[str, Any, str]],
    tok: Tokenizer | None,
    inference: dict[str, Any] | None = None,
) -> ReportData:
    """`shards`: (kind, parquet path or file-like, name for errors)."""
    stats = DatasetStats()
    sources = []
    for kind, source, where in shards:
        stats.add_shard(source, kind, tok, where)
        sources.append(where)
    notes = []
    if tok is None:
        notes.append("reasoning / content / tool-section lengths need the tokenizer the ids "
                     "were built with; pass --tokenizer")
    return ReportData(dataset=dataset, gate=gate, stats=stats, inference=inference,
                      sources=sources, notes=notes)


def sum_inference(summaries: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    total: dict[str, Any] = {}
    chunks = 0
    for summary in summaries:
        chunks += 1
        for key in INFERENCE_SUMS:
            value = summary.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
        for name, count in (summary.get("errors") or {}).items():
            errors = total.setdefault("errors", {})
            errors[name] = errors.get(name, 0) + count
    if not chunks:
        return None
    total["chunks"] = chunks
    return total


def rawlog_spend(folder: Path) -> dict[str, Any] | None:
    """What every attempt in a raw log cost, and its tokens (retries included); the records of
    requests refused by the context check, never sent, are not attempts."""
    files = sorted(folder.rglob("part-*.jsonl"))
    if not files:
        return None
    total: dict[str, Any] = {"requests_sent": 0, "cost_usd": 0.0, "prompt_tokens": 0,
                             "completion_tokens": 0, "ok": 0, "failed": 0}
    for file in files:
        with file.open("rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if not isinstance(record, dict) or is_context_refusal(record):
                    # A conversation's request over the context is refused before it is sent
                    # (its final record stops the conversation with `length`): not a request.
                    continue
                total["requests_sent"] += 1
                cost = record.get("cost_usd")
                if isinstance(cost, int | float):
                    total["cost_usd"] += cost
                raw_usage = record.get("usage")
                usage = raw_usage if isinstance(raw_usage, dict) else {}
                for key in ("prompt_tokens", "completion_tokens"):
                    if isinstance(usage.get(key), int):
                        total[key] += usage[key]
                if record.get("final"):
                    ok = record.get("status") in ("ok", "truncated")
                    total["ok" if ok else "failed"] += 1
    return total


# --- reading a folder -----------------------------------------------------------------------


def find_gate_dir(path: Path) -> Path:
    """The folder holding report.json: DIR itself, or the newest gate stage under a dataset."""
    if (path / "report.json").is_file():
        return path
    candidates = sorted((p.parent for p in path.glob("gate/*/report.json")),
                        key=lambda p: p.stat().st_mtime)
    if candidates:
        return candidates[-1]
    raise ReportError(f"{path}: no report.json here nor under gate/*/ (give the output folder "
                      "of `specregen gate`, a pipeline gate stage, or a dataset folder)")


def shard_files(gate_dir: Path) -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for kind in ("accepted", "quarantined"):
        single = gate_dir / f"{kind}.parquet"
        if single.is_file():
            files.append((kind, single))
        files += [(kind, p) for p in sorted((gate_dir / kind).glob("*.parquet"))]
    return files


def read_gate_dir(path: Path, tok: Tokenizer | None, rawlog: Path | None = None) -> ReportData:
    gate_dir = find_gate_dir(path)
    try:
        gate = json.loads((gate_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {gate_dir / 'report.json'}: {exc}") from None
    files = shard_files(gate_dir)
    if not files:
        raise ReportError(f"{gate_dir} holds no accepted/quarantined parquet shards")
    notes = []
    inference = None
    if rawlog is not None:
        inference = rawlog_spend(rawlog)
        if inference is None:
            raise ReportError(f"{rawlog} holds no raw log parts (part-*.jsonl)")
        notes.append(f"spend: every attempt in {rawlog}")
    else:
        inference, note = _pipeline_inference(gate_dir)
        if note:
            notes.append(note)
    data = collect(str(gate.get("dataset") or gate_dir.name), gate,
                   ((kind, file, str(file)) for kind, file in files), tok, inference)
    data.notes = notes + data.notes
    return data


def _pipeline_inference(gate_dir: Path) -> tuple[dict[str, Any] | None, str]:
    dataset_dir = gate_dir.parent.parent
    if gate_dir.parent.name != "gate" or not (dataset_dir / "infer").is_dir():
        return None, ("spend not recorded here: pass --rawlog RAWLOG_FOLDER for the cost and "
                      "tokens of inference")
    folders = sorted((p for p in (dataset_dir / "infer").iterdir() if p.is_dir()),
                     key=lambda p: p.stat().st_mtime)
    if not folders:
        return None, "spend: the infer stage has no finished chunk yet"
    chosen = folders[-1]
    summaries = []
    for file in sorted(chosen.glob("chunk-*.json")):
        try:
            summaries.append(json.loads(file.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    note = f"spend: the infer stage's chunk summaries in {chosen}"
    if len(folders) > 1:
        note += f" (the newest of {len(folders)} endpoint runs)"
    return sum_inference(summaries), note

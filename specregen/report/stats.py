"""The numbers of a dataset report, from the gate's shards (one pass, one shard at a time).

Lengths come from the ids, not the texts: the reasoning is what precedes the format's reasoning
end in the completion, the content what lies between it and the tool calls (or the stop token),
found with numpy over each shard's flattened `input_ids`, so 20,000 samples take a fraction of a
second. The structural tokens are the format's (`ChatFormat.markers`): the one the shard records,
else the one given, else the default.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specregen.errors import UsageError
from specregen.models.chat_format import CompletionMarkers
from specregen.models.tokenizer import Tokenizer

LENGTHS = ("prompt", "reasoning", "content", "tool_section", "completion")
_COLUMNS = ("sample_id", "input_ids", "prompt_len", "completion_len", "status", "flags",
            "finish_reason", "tool_calls", "thinking")


class ReportError(UsageError):
    """A shard or gate folder the report cannot read; the message names it."""


@dataclass
class DatasetStats:
    """Counters and per-sample length arrays of one dataset."""

    samples: int = 0
    accepted: int = 0
    quarantined: int = 0
    lengths: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {name: [] for name in LENGTHS})
    finish_reasons: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    evidence: Counter[str] = field(default_factory=Counter)
    evidence_accepted: Counter[str] = field(default_factory=Counter)
    quarantine_checks: Counter[str] = field(default_factory=Counter)
    calls_per_sample: Counter[int] = field(default_factory=Counter)
    tools: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    has_evidence: bool = False
    # Layout tokens by format name (each shard names its format; one lookup per name).
    _markers: dict[str, CompletionMarkers] = field(default_factory=dict, repr=False)

    def length_array(self, name: str) -> np.ndarray:
        parts = self.lengths[name]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def add_shard(self, source: Any, kind: str, tok: Tokenizer | None, where: str,
                  markers: CompletionMarkers | None = None) -> None:
        """One parquet shard (path or file-like); `kind` is accepted or quarantined.
        `markers`: the layout tokens; None reads the format the shard records."""
        try:
            handle = pq.ParquetFile(source)
            names = handle.schema_arrow.names
            columns = [c for c in (*_COLUMNS, "evidence", "reasons") if c in names]
            table = handle.read(columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise ReportError(f"cannot read {where}: {exc}") from None
        missing = [c for c in _COLUMNS if c not in names]
        if missing:
            raise ReportError(f"{where} is not a token shard: it lacks {', '.join(missing)}")
        n = table.num_rows
        self.samples += n
        if kind == "accepted":
            self.accepted += n
        else:
            self.quarantined += n
        if n == 0:
            return
        prompt = table["prompt_len"].to_numpy(zero_copy_only=False).astype(np.int64)
        completion = table["completion_len"].to_numpy(zero_copy_only=False).astype(np.int64)
        self.prompt_tokens += int(prompt.sum())
        self.completion_tokens += int(completion.sum())
        self.lengths["prompt"].append(prompt)
        self.lengths["completion"].append(completion)
        if tok is not None:
            layout = markers or self._recorded_markers(handle, tok, where)
            thinking = np.asarray(table["thinking"].to_pylist(), dtype=bool)
            reasoning, content, section = split_lengths(
                table["input_ids"], prompt, thinking, tok, layout)
            self.lengths["reasoning"].append(reasoning)
            self.lengths["content"].append(content)
            self.lengths["tool_section"].append(section)
        self.statuses.update(table["status"].to_pylist())
        self.finish_reasons.update(str(r) for r in table["finish_reason"].to_pylist())
        for flags in table["flags"].to_pylist():
            self.flags.update(flags or [])
        if "evidence" in names:
            self.has_evidence = True
            levels = [str(e) for e in table["evidence"].to_pylist()]
            self.evidence.update(levels)
            if kind == "accepted":
                self.evidence_accepted.update(levels)
        if "reasons" in names:
            for reasons in table["reasons"].to_pylist():
                # "check: detail" -> check; each check once per sample.
                self.quarantine_checks.update({r.split(":", 1)[0] for r in reasons or []})
        for text in table["tool_calls"].to_pylist():
            try:
                calls = json.loads(text or "[]")
            except ValueError:
                calls = []
            self.calls_per_sample[len(calls)] += 1
            self.tools.update(str(c.get("name"))[:80] for c in calls if isinstance(c, dict))


    def _recorded_markers(self, handle: pq.ParquetFile, tok: Tokenizer,
                          where: str) -> CompletionMarkers:
        from specregen.models.registry import DEFAULT_FORMAT, get_format
        from specregen.store.token_samples import META_KEY

        name = DEFAULT_FORMAT  # files written before they recorded a format
        raw = (handle.schema_arrow.metadata or {}).get(META_KEY)
        try:
            recorded = json.loads(raw).get("format") if raw else None
        except (ValueError, AttributeError):
            recorded = None
        if isinstance(recorded, dict) and isinstance(recorded.get("name"), str):
            name = recorded["name"]
        if name not in self._markers:
            try:
                self._markers[name] = get_format(name, tok).markers
            except UsageError as exc:  # unknown format, or a tokenizer without its tokens
                raise ReportError(f"{where}: {exc}") from None
        return self._markers[name]


def split_lengths(
    input_ids: pa.ChunkedArray, prompt: np.ndarray, thinking: np.ndarray, tok: Tokenizer,
    markers: CompletionMarkers,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: reasoning, content and tool-call token counts of the completion."""
    think_end = tok.added_tokens.get(markers.reasoning_end, -1)
    section = tok.added_tokens.get(markers.calls_begin, -1)
    im_end = tok.added_tokens.get(markers.end, -1)
    flat = pa.concat_arrays([c.flatten() for c in input_ids.chunks]) if input_ids.num_chunks \
        else pa.array([], pa.int32())
    values = flat.to_numpy(zero_copy_only=False)
    lengths = np.asarray(pc.list_value_length(input_ids).fill_null(0)
                         .to_numpy(zero_copy_only=False), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    start = offsets[:-1] + prompt  # first completion position of each row, in `values`
    end = offsets[1:]
    n = len(prompt)
    has_end = np.zeros(n, dtype=bool)
    nonempty = end > start
    has_end[nonempty] = values[end[nonempty] - 1] == im_end
    text_end = end - has_end  # where the model's own tokens stop

    def first(token: int) -> np.ndarray:
        """Per row, the first position of `token` inside the completion, else -1."""
        hits = np.flatnonzero(values == token)
        out = np.full(n, -1, dtype=np.int64)
        if hits.size == 0:
            return out
        rows = np.searchsorted(offsets, hits, side="right") - 1
        keep = hits >= start[rows]
        hits, rows = hits[keep], rows[keep]
        unique_rows, index = np.unique(rows, return_index=True)
        out[unique_rows] = hits[index]
        return out

    think_at = first(think_end)
    section_at = first(section)
    body_end = np.where(section_at >= 0, section_at, text_end)
    # Thinking with no reasoning end: cut off while reasoning, or the calls opened inside it.
    reasoning_end = np.where(think_at >= 0, think_at, np.where(thinking, body_end, start))
    reasoning = np.maximum(0, reasoning_end - start)
    content_start = np.where(think_at >= 0, think_at + 1, reasoning_end)
    content = np.maximum(0, body_end - content_start)
    section_len = np.where(section_at >= 0, np.maximum(0, text_end - section_at), 0)
    return reasoning, content, section_len


def summary(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"n": 0}
    q = np.percentile(values, [50, 90, 99])
    return {"n": int(values.size), "mean": float(values.mean()), "p50": float(q[0]),
            "p90": float(q[1]), "p99": float(q[2]), "max": float(values.max()),
            "zero": int((values == 0).sum())}


def histogram(values: np.ndarray, bins: int = 30) -> dict[str, Any]:
    """Equal-width bins from 0 to the 99th percentile, and one bin for the rest."""
    if values.size == 0:
        return {"edges": [], "counts": [], "over": 0}
    top = float(np.percentile(values, 99))
    top = max(top, 1.0)
    width = max(1.0, np.ceil(top / bins))
    edges = np.arange(0, width * bins + 1, width)
    counts, _ = np.histogram(values[values < edges[-1]], bins=edges)
    return {"edges": edges.tolist(), "counts": counts.tolist(),
            "over": int((values >= edges[-1]).sum())}

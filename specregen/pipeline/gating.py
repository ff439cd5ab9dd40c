"""Stage `gate`: every reconstructed shard through the tool-call gate; accepted and quarantined
shards, the report, and the verdict. The gate cannot be skipped: publish reads its manifest."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specregen.gate import GateReport, run_gate
from specregen.gate.declared import by_prompt
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.prompts import read_chunk
from specregen.pipeline.reconstruction import STAGE as RECONSTRUCT
from specregen.pipeline.reconstruction import run_format
from specregen.progress import Progress
from specregen.records import Declaration, TokenSample
from specregen.store.manifest import Shard, StageManifest, read_manifest, write_manifest
from specregen.store.token_samples import (
    read_token_samples,
    token_file_meta,
    token_samples_bytes,
)

STAGE = "gate"


def gate_dataset(
    run: DatasetRun, reconstructed: StageManifest, progress: Progress | None = None
) -> StageManifest:
    """Run the gate over the dataset; the manifest's `extra` holds the verdict and the report.
    `progress` counts accepted samples as done and quarantined ones as failed."""
    done = read_manifest(run.store, run.name, STAGE, run.gate_fp)
    if done is not None:
        return done
    # The dataset's own answers and what each prompt declares, one chunk at a time (shard k
    # is chunk k): memory stays flat.
    reference: dict[str, dict[str, Any] | None] = {}
    declarations: dict[str, Declaration] = {}
    shards: list[Shard] = []
    accepted: list[TokenSample] = []
    quarantined: list[tuple[TokenSample, list[str]]] = []
    # Gate shards record the tokenizer and format like the reconstruct shards they come from,
    # so every later reader (report, inspect, export) decodes them with the right ones.
    meta = token_file_meta(run_format(run), run.config.tokenizer)

    def flush(name: str) -> None:
        for kind, samples, reasons in (
            ("accepted", accepted, None),
            ("quarantined", [s for s, _ in quarantined], [r for _, r in quarantined]),
        ):
            data = token_samples_bytes(samples, reasons, meta)
            path = f"{kind}/{name}"
            digest = run.store.write_bytes(data, run.name, STAGE, run.gate_fp, kind, name)
            shards.append(Shard(path=path, rows=len(samples), sha256=digest))
        accepted.clear()
        quarantined.clear()

    def samples() -> Iterator[TokenSample]:
        for chunk, shard in enumerate(reconstructed.shards):
            reference.clear()
            declarations.clear()
            _read_prompts(run, chunk, reference, declarations)
            # Ids are unique across chunks (the source reader drops duplicates); within a
            # shard, a sample answered in two runs counts once.
            seen: set[str] = set()
            data = run.store.read_bytes(run.name, RECONSTRUCT, run.reconstruct_fp, shard.path)
            for sample in read_token_samples(io.BytesIO(data)):
                if sample.sample_id not in seen:
                    seen.add(sample.sample_id)
                    yield sample
            flush(shard.path)

    def on_accept(sample: TokenSample, _decision: Any) -> None:
        accepted.append(sample)
        if progress is not None:
            progress.advance(done=1, tokens=sample.completion_len)

    def on_quarantine(sample: TokenSample, decision: Any) -> None:
        quarantined.append((sample, decision.reason_strings()))
        if progress is not None:
            progress.advance(failed=1, tokens=sample.completion_len)

    report = run_gate(
        samples(),
        run_format(run),
        run.dataset.gate_config(),
        dataset=run.name,
        reference=reference,
        on_accept=on_accept,
        on_quarantine=on_quarantine,
        provider=None if run.traits is None else run.traits.to_dict(),
        declarations=by_prompt(declarations),
    )
    run.store.write_bytes(report.to_json().encode(), run.name, STAGE, run.gate_fp, "report.json")
    run.store.write_bytes(report.to_markdown().encode(), run.name, STAGE, run.gate_fp,
                          "report.md")
    _write_html_report(run, report, shards)
    manifest = StageManifest(
        dataset=run.name, stage=STAGE, fingerprint=run.gate_fp,
        counts=_counts(report), shards=shards,
        extra=GateVerdict(report.passed, tuple(report.why)).to_extra(),
    )
    write_manifest(run.store, manifest)
    return manifest


@dataclass(frozen=True)
class GateVerdict:
    """The dataset's gate outcome, read from and written to the gate manifest."""

    passed: bool
    why: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return "pass" if self.passed else "fail"

    def to_extra(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": self.label, "why": list(self.why)}

    @classmethod
    def of(cls, manifest: StageManifest) -> GateVerdict:
        return cls.of_extra(manifest.extra)

    @classmethod
    def of_extra(cls, extra: dict[str, Any]) -> GateVerdict:
        """From `to_extra()`'s fields (the manifest's, or what the gate task returns)."""
        return cls(extra.get("passed") is True, tuple(extra.get("why") or ()))


def _write_html_report(run: DatasetRun, report: GateReport, shards: list[Shard]) -> None:
    # report.html beside report.md: the charts, from the shards just written.
    from specregen.report import render_report
    from specregen.report.stage import stage_report

    data = stage_report(run, report.to_dict(), shards, run_format(run).tok)
    run.store.write_bytes(render_report(data).encode(), run.name, STAGE, run.gate_fp,
                          "report.html")


def read_report(run: DatasetRun) -> tuple[dict[str, Any], str]:
    """The gate report as JSON and Markdown."""
    import json

    data = run.store.read_bytes(run.name, STAGE, run.gate_fp, "report.json")
    markdown = run.store.read_bytes(run.name, STAGE, run.gate_fp, "report.md").decode()
    return json.loads(data), markdown


def _read_prompts(run: DatasetRun, chunk: int, reference: dict[str, dict[str, Any] | None],
                  declarations: dict[str, Declaration]) -> None:
    """What the gate needs of the chunk's prompts: the dataset's own answers (only what
    trigger agreement needs: text answers shrink to their kind) and the functions each prompt
    declares, as its adapter stated them (the gate reads no system prompt)."""
    for prompt in read_chunk(run, chunk):
        ref = prompt.meta.get("reference_first_turn")
        if isinstance(ref, dict):
            reference[prompt.sample_id] = {"kind": "text"} if ref.get("kind") == "text" else ref
        if prompt.declared_tools or prompt.declaration_problem:
            declarations[prompt.sample_id] = prompt.declaration


def _counts(report: GateReport) -> dict[str, int]:
    return {k: v for k, v in report.totals.items() if isinstance(v, int)}

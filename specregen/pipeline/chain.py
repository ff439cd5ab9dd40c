"""The dataset stage chain, defined once: its order and the decisions between the stages.

Both ways of running a dataset walk this chain: the library path (`pipeline/run.py`, plain
function calls) and the Prefect flow (`flows/dataset.py`, one task per stage). Each supplies
the stages as a `DatasetSteps`; `run_chain` decides what runs next: skip a published dataset,
check before paying, the endpoint probe (a refusal ends the run before any paid request), the
prompts, inference (realtime or batch, the steps' choice), reconstruction, the gate (a failed
gate ends the run unpublished) and publish.

One failure protocol: a step RETURNS its outcome (a probe's refusal, the gate's verdict); it
raises only for what stops it from having one (a missing source or key, storage, a bug). So a
refused or gate-failed dataset reaches the end of the chain under both runners, and gets its
run summary (pipeline/summary.py) before anything fails: the library returns the outcome, the
flow publishes the summary artifact and then raises `ChainEnd.failure()` so its run ends
Failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from specregen.errors import SpecregenError
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.inference import InferenceStoppedError
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.publish import GateFailedError
from specregen.probe.refusal import ProbeRefusal

STAGES = ("skip_if_published", "check_before_paying", "probe", "prompts", "inference",
          "reconstruct", "gate", "publish")

Outcome = Literal["published", "skipped", "gate_failed", "stopped", "refused"]


@dataclass(frozen=True)
class ProbeStep:
    """The probe stage's result: the run (with the endpoint's traits), its summary, and why the
    dataset must not be paid for, when it must not."""

    run: DatasetRun
    summary: dict[str, Any] | None
    refusal: str | None = None
    cost_usd: float = 0.0

    @classmethod
    def of_summary(cls, run: DatasetRun, summary: dict[str, Any]) -> ProbeStep:
        """From the probe outcome's `summary()` (what a Prefect task returns: JSON-able)."""
        return cls(run, summary, summary.get("refusal"), float(summary.get("cost_usd") or 0.0))


class DatasetSteps(Protocol):
    """The stages of one dataset, as one runner implements them."""

    async def published(self, run: DatasetRun) -> dict[str, Any] | None: ...

    async def check_before_paying(self, run: DatasetRun) -> None: ...

    async def probe(self, run: DatasetRun) -> ProbeStep: ...

    async def prompts(self, run: DatasetRun) -> int:
        """Prepare the prompts; returns the number of chunks."""
        ...

    async def infer(self, run: DatasetRun, chunks: int) -> list[dict[str, Any]]: ...

    async def reconstruct(self, run: DatasetRun, chunks: int) -> None: ...

    async def gate(self, run: DatasetRun) -> GateVerdict: ...

    async def publish(self, run: DatasetRun) -> dict[str, Any]: ...


@dataclass
class ChainEnd:
    """Where the chain stopped, and what the stages returned on the way."""

    outcome: Outcome
    run: DatasetRun
    published: dict[str, Any] | None = None
    probe: ProbeStep | None = None
    inferred: list[dict[str, Any]] = field(default_factory=list)
    verdict: GateVerdict | None = None

    def failure(self) -> SpecregenError | GateFailedError | None:
        """The error this end is, for a runner whose run must fail with it (the flow, after
        its summary is published); None when the run succeeded (published, skipped)."""
        if self.outcome == "refused":
            assert self.probe is not None and self.probe.refusal is not None
            return ProbeRefusal(self.probe.refusal)
        if self.outcome == "gate_failed":
            why = self.verdict.why if self.verdict is not None else ()
            return GateFailedError(f"{self.run.name}: gate failed: " + "; ".join(why))
        if self.outcome == "stopped":
            stops = sorted({str(r["stopped_reason"]) for r in self.inferred
                            if r.get("stopped_reason")})
            left = sum(int(r.get("abandoned") or 0) for r in self.inferred)
            return InferenceStoppedError(
                f"{self.run.name}: inference stopped ({', '.join(stops)}) with {left} samples"
                " left; run again to resume")
        return None


async def run_chain(run: DatasetRun, steps: DatasetSteps) -> ChainEnd:
    """Walk the chain for one dataset (the caller holds the dataset's lease)."""
    done = await steps.published(run)
    if done is not None:
        return ChainEnd("skipped", run, published=done)
    await steps.check_before_paying(run)  # source readable, key present: fails at once
    probe = await steps.probe(run)
    run = probe.run
    if probe.refusal is not None:  # nothing was paid for but the probe's few requests
        return ChainEnd("refused", run, probe=probe)
    chunks = await steps.prompts(run)
    inferred = await steps.infer(run, chunks)
    if any(r.get("stopped_reason") for r in inferred):  # the budget or a fatal error
        return ChainEnd("stopped", run, probe=probe, inferred=inferred)
    await steps.reconstruct(run, chunks)
    verdict = await steps.gate(run)
    if not verdict.passed:
        return ChainEnd("gate_failed", run, probe=probe, inferred=inferred, verdict=verdict)
    published = await steps.publish(run)
    return ChainEnd("published", run, published=published, probe=probe, inferred=inferred,
                    verdict=verdict)

"""One dataset end to end without Prefect: the library runner of the stage chain
(`pipeline/chain.py`, which the flow runs too)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from specregen.client.reach import is_loopback
from specregen.client.secrets import ApiKey
from specregen.config import PipelineConfig
from specregen.errors import AuthError, StorageError, UsageError, is_missing_credentials
from specregen.pipeline.chain import Outcome, ProbeStep, run_chain
from specregen.pipeline.gating import GateVerdict, gate_dataset
from specregen.pipeline.inference import infer_chunk
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import probe_stage, with_stored_traits
from specregen.pipeline.prompts import prepare_prompts
from specregen.pipeline.publish import publish_dataset, published
from specregen.pipeline.reconstruction import reconstruct_dataset
from specregen.store.lease import Lease, acquire_lease
from specregen.store.manifest import StageManifest


class MissingKeyError(AuthError, RuntimeError):
    """No API key where one is needed; the message names the variable, never a value."""


@dataclass
class DatasetResult:
    dataset: str
    outcome: Outcome
    summary: dict[str, Any] = field(default_factory=dict)


def resolve_api_key(config: PipelineConfig, secret_value: str | None = None) -> ApiKey | None:
    """The key from a Prefect Secret's value (given by the flow), else from the environment.

    A loopback endpoint (the emulator, a local vLLM) may run without one.
    """
    value = secret_value or os.environ.get(config.endpoint.api_key_env)
    if value:
        return ApiKey(value)
    if is_loopback(config.endpoint.base_url):
        return None
    raise MissingKeyError(
        f"no API key: set the environment variable {config.endpoint.api_key_env}"
        + (f" or the Prefect Secret {config.api_key_secret!r}" if config.api_key_secret else "")
    )


def dataset_lease(run: DatasetRun, *, wait: float = 0.0) -> Lease:
    """One writer per dataset and storage: the lease on `{storage}/{dataset}/`, held from
    before the first request to publish. Taking it also proves the storage writable and its
    credentials present. A second run waits up to `wait` s, then stops naming the holder."""
    return acquire_lease(run.store.url_of(run.name), wait=wait,
                         what=f"specregen run of {run.name}")


def check_source(run: DatasetRun) -> None:
    """The dataset's source can be opened and read, before anything is paid for."""
    import fsspec

    source = run.dataset.source
    where = f"{run.name}: source {source}"
    try:
        with fsspec.open(source, "rb", compression="infer") as stream:
            stream.read(1)
    except FileNotFoundError:
        raise UsageError(f"{where} does not exist",
                         hint="fix the dataset's `source` in the config") from None
    except Exception as exc:
        if is_missing_credentials(exc):
            raise StorageError(f"{where} cannot be read: no storage credentials found",
                               hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
                               ) from None
        text = str(exc).strip()
        detail = getattr(exc, "strerror", None) or (text.splitlines()[0] if text else "")
        raise UsageError(f"{where} cannot be read: {type(exc).__name__}"
                         + (f": {detail}" if detail else ""),
                         hint="check the dataset's `source` and its access") from None


def check_before_paying(run: DatasetRun, api_key_found: bool) -> None:
    """What a dataset needs before its first paid request, else one clear error: the source
    is readable and the key is there (or not needed). Storage is proven by taking the
    dataset's lease; the endpoint's probe is checked next (probing.py)."""
    check_source(run)
    if not api_key_found:
        resolve_api_key(run.config)  # raises MissingKeyError naming the variable


def chunk_concurrency(config: PipelineConfig) -> int:
    """Each of the chunks running at once gets its share of the endpoint's window."""
    return max(1, config.endpoint.concurrency // config.chunks_in_flight)


async def run_dataset(
    run: DatasetRun, api_key: ApiKey | None, *, lease_wait: float = 0.0
) -> DatasetResult:
    """Prompts, inference, reconstruction, gate, publish: each skipped when already done."""
    lease = await asyncio.to_thread(dataset_lease, run, wait=lease_wait)
    with lease:
        return await _run_dataset(run, api_key)


class LibrarySteps:
    """The chain's stages as plain calls (inference realtime, reconstruction in processes)."""

    def __init__(self, api_key: ApiKey | None) -> None:
        self.api_key = api_key
        self.prompts_manifest: StageManifest | None = None
        self.reconstructed: StageManifest | None = None
        self.gated: StageManifest | None = None

    async def published(self, run: DatasetRun) -> dict[str, Any] | None:
        done = published(run)
        return None if done is None else done.counts

    async def check_before_paying(self, run: DatasetRun) -> None:
        check_before_paying(run, self.api_key is not None)

    async def probe(self, run: DatasetRun) -> ProbeStep:
        outcome = await asyncio.to_thread(probe_stage, run, self.api_key)
        return ProbeStep(outcome.run, outcome.summary(), outcome.refusal, outcome.cost_usd)

    async def prompts(self, run: DatasetRun) -> int:
        self.prompts_manifest = prepare_prompts(run)
        return self.prompts_manifest.counts["chunks"]

    async def infer(self, run: DatasetRun, chunks: int) -> list[dict[str, Any]]:
        window = asyncio.Semaphore(run.config.chunks_in_flight)

        async def one(k: int) -> dict[str, Any]:
            async with window:
                return await infer_chunk(run, k, api_key=self.api_key,
                                         concurrency=chunk_concurrency(run.config))

        return list(await asyncio.gather(*(one(k) for k in range(chunks))))

    async def reconstruct(self, run: DatasetRun, chunks: int) -> None:
        self.reconstructed = await asyncio.to_thread(reconstruct_dataset, run, chunks)

    async def gate(self, run: DatasetRun) -> GateVerdict:
        assert self.reconstructed is not None  # the chain reconstructs first
        self.gated = gate_dataset(run, self.reconstructed)
        return GateVerdict.of(self.gated)

    async def publish(self, run: DatasetRun) -> dict[str, Any]:
        assert self.gated is not None
        return publish_dataset(run, self.gated).counts


async def _run_dataset(run: DatasetRun, api_key: ApiKey | None) -> DatasetResult:
    started = time.monotonic()
    run = with_stored_traits(run)  # reconstruction's fingerprint, so the skip check's, has them
    steps = LibrarySteps(api_key)
    end = await run_chain(run, steps)
    run = end.run
    if end.outcome == "skipped":
        return DatasetResult(run.name, "skipped", {"published": end.published})
    probe = end.probe
    if end.outcome == "refused":
        assert probe is not None
        return DatasetResult(run.name, "refused", {
            "dataset": run.name, "refusal": probe.refusal, "probe": probe.summary,
            "cost_usd": round(probe.cost_usd, 6), "wall_s": round(time.monotonic() - started, 2)})
    assert steps.prompts_manifest is not None
    return DatasetResult(run.name, end.outcome,
                         summarize(run, steps.prompts_manifest, end.inferred, steps.reconstructed,
                                   steps.gated, time.monotonic() - started,
                                   probe=probe.summary if probe else None))


def summarize(
    run: DatasetRun,
    prompts: StageManifest,
    inferred: list[dict[str, Any]],
    reconstructed: StageManifest | None,
    gated: StageManifest | None,
    wall_s: float,
    probe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run summary: samples, accepted, quarantined by reason, tokens, cost (the endpoint
    probe's included, see `probe`), match rates."""
    recon = reconstructed.counts if reconstructed else {}
    summary: dict[str, Any] = {
        "dataset": run.name,
        "prompts": prompts.counts.get("prompts", 0),
        "rejected_rows": prompts.counts.get("rejected", 0),
        # never sent: over the context length (pipeline/inference.py) or not JSON
        "rejected_requests": sum(r.get("rejected", 0) for r in inferred),
        "requests_sent": sum(r.get("requests_sent", 0) for r in inferred),
        "failed_requests": sum(r.get("failed", 0) for r in inferred),
        "prompt_tokens": sum(r.get("prompt_tokens", 0) for r in inferred),
        "completion_tokens": sum(r.get("completion_tokens", 0) for r in inferred),
        "cost_usd": round(sum(r.get("cost_usd", 0.0) for r in inferred), 6),
        "reconstructed": {k: v for k, v in recon.items() if not k.startswith("reference_")},
        "reference_match": {k.removeprefix("reference_"): v for k, v in recon.items()
                            if k.startswith("reference_")},
        "wall_s": round(wall_s, 2),
        "storage": run.store.url_of(run.name),
    }
    if gated is not None:
        verdict = GateVerdict.of(gated)
        summary["gate"] = {"verdict": verdict.label, "why": list(verdict.why), **gated.counts}
        summary["gate_report"] = run.store.url_of(run.name, "gate", run.gate_fp, "report.md")
    conversations = conversation_outcome(run, inferred, gated)
    if conversations is not None:
        summary["conversations"] = conversations
    if any("spent_total_usd" in r for r in inferred):
        # Batch mode: a chunk's cost_usd is its last pass; spent_total_usd is everything its raw
        # log was charged (every batch, realtime fallback, earlier runs), with the projection
        # and the realtime price of the same answers beside it (client/batch.py).
        def total(name: str) -> float:
            return round(sum(float(r.get(name) or 0.0) for r in inferred), 6)

        summary["cost_usd"] = total("spent_total_usd")
        summary["projected_total_usd"] = total("projected_total_usd")
        summary["realtime_equivalent_usd"] = total("realtime_equivalent_total_usd")
        summary["savings_usd"] = total("savings_total_usd")
    if probe is not None:
        summary["probe"] = probe
        summary["cost_usd"] = round(summary["cost_usd"] + probe.get("cost_usd", 0.0), 6)
        if "projected_total_usd" in summary:
            summary["projected_total_usd"] = round(
                summary["projected_total_usd"] + probe.get("cost_usd", 0.0), 6)
    return summary


def conversation_outcome(run: DatasetRun, inferred: list[dict[str, Any]],
                         gated: StageManifest | None) -> dict[str, Any] | None:
    """How a `turns: all` dataset's conversations ended: how many, by stop reason, and by user
    turns reached (one sample each). The gate report's, read from its samples, when the gate
    ran; else what inference recorded (stop reasons only). None for single-turn datasets."""
    if gated is not None:
        try:
            report = json.loads(run.store.read_bytes(run.name, "gate", run.gate_fp,
                                                     "report.json"))
        except (StorageError, OSError, ValueError):
            report = {}
        conv = report.get("conversations") if isinstance(report, dict) else None
        if isinstance(conv, dict) and conv.get("conversations"):
            return {"count": conv["conversations"], "by_stop_reason": conv["by_stop_reason"],
                    "user_turns": conv["user_turns"], "samples": conv.get("samples", 0)}
    stops: Counter[str] = Counter()
    for chunk in inferred:
        stops.update(chunk.get("conversation_stops") or {})
    count = sum(int(chunk.get("conversations") or 0) for chunk in inferred)
    if not count:
        return None
    return {"count": count, "by_stop_reason": dict(stops)}

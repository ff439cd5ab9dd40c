"""One dataset end to end without Prefect: the library path that the flows mirror step by step."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.client.command import is_loopback
from specregen.client.secrets import ApiKey
from specregen.config import PipelineConfig
from specregen.pipeline.gating import gate_dataset
from specregen.pipeline.inference import infer_chunk
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.prompts import prepare_prompts
from specregen.pipeline.publish import publish_dataset, published
from specregen.pipeline.reconstruction import reconstruct_dataset
from specregen.store.manifest import StageManifest

Outcome = Literal["published", "skipped", "gate_failed", "stopped"]


class MissingKeyError(RuntimeError):
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


def chunk_concurrency(config: PipelineConfig) -> int:
    """Each of the chunks running at once gets its share of the endpoint's window."""
    return max(1, config.endpoint.concurrency // config.chunks_in_flight)


async def run_dataset(run: DatasetRun, api_key: ApiKey | None) -> DatasetResult:
    """Prompts, inference, reconstruction, gate, publish: each skipped when already done."""
    started = time.monotonic()
    done = published(run)
    if done is not None:
        return DatasetResult(run.name, "skipped", {"published": done.counts})
    prompts = prepare_prompts(run)
    chunks = prompts.counts["chunks"]
    gate = asyncio.Semaphore(run.config.chunks_in_flight)

    async def one(k: int) -> dict[str, Any]:
        async with gate:
            return await infer_chunk(run, k, api_key=api_key,
                                     concurrency=chunk_concurrency(run.config))

    inferred = await asyncio.gather(*(one(k) for k in range(chunks)))
    if any(r.get("stopped_reason") for r in inferred):
        return DatasetResult(run.name, "stopped", summarize(run, prompts, inferred, None, None,
                                                            time.monotonic() - started))
    reconstructed = await asyncio.to_thread(reconstruct_dataset, run, chunks)
    gated = gate_dataset(run, reconstructed)
    if not gated.extra.get("passed"):
        return DatasetResult(run.name, "gate_failed",
                             summarize(run, prompts, inferred, reconstructed, gated,
                                       time.monotonic() - started))
    publish_dataset(run, gated)
    return DatasetResult(run.name, "published",
                         summarize(run, prompts, inferred, reconstructed, gated,
                                   time.monotonic() - started))


def summarize(
    run: DatasetRun,
    prompts: StageManifest,
    inferred: list[dict[str, Any]],
    reconstructed: StageManifest | None,
    gated: StageManifest | None,
    wall_s: float,
) -> dict[str, Any]:
    """The run summary: samples, accepted, quarantined by reason, tokens, cost, match rates."""
    recon = reconstructed.counts if reconstructed else {}
    summary: dict[str, Any] = {
        "dataset": run.name,
        "prompts": prompts.counts.get("prompts", 0),
        "rejected_rows": prompts.counts.get("rejected", 0),
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
        summary["gate"] = {"verdict": gated.extra.get("verdict"), "why": gated.extra.get("why"),
                           **gated.counts}
        summary["gate_report"] = run.store.url_of(run.name, "gate", run.gate_fp, "report.md")
    return summary

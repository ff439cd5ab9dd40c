"""One dataset end to end without Prefect: the library runner of the stage chain
(`pipeline/chain.py`, which the flow runs too), over the steps the flow's tasks wrap
(`pipeline/steps.py`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from specregen.client.secrets import ApiKey
from specregen.errors import StorageError, UsageError, is_missing_credentials
from specregen.pipeline.apikey import resolve_api_key
from specregen.pipeline.chain import Outcome, ProbeStep, run_chain
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.inference import infer_chunk
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import probe_stage, with_stored_traits
from specregen.pipeline.prompts import prepare_prompts
from specregen.pipeline.reconstruction import reconstruct_dataset
from specregen.pipeline.steps import gate_step, publish_step, published_step
from specregen.pipeline.summary import end_summary
from specregen.pipeline.window import chunk_concurrency, each_chunk
from specregen.store.lease import Lease, acquire_lease


@dataclass
class DatasetResult:
    dataset: str
    outcome: Outcome
    summary: dict[str, Any] = field(default_factory=dict)


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

    async def published(self, run: DatasetRun) -> dict[str, Any] | None:
        return published_step(run)

    async def check_before_paying(self, run: DatasetRun) -> None:
        check_before_paying(run, self.api_key is not None)

    async def probe(self, run: DatasetRun) -> ProbeStep:
        outcome = await asyncio.to_thread(probe_stage, run, self.api_key)
        return ProbeStep.of_summary(outcome.run, outcome.summary())

    async def prompts(self, run: DatasetRun) -> int:
        return prepare_prompts(run).counts["chunks"]

    async def infer(self, run: DatasetRun, chunks: int) -> list[dict[str, Any]]:
        async def one(k: int) -> dict[str, Any]:
            return await infer_chunk(run, k, api_key=self.api_key,
                                     concurrency=chunk_concurrency(run.config))

        return await each_chunk(run.config, chunks, one)

    async def reconstruct(self, run: DatasetRun, chunks: int) -> None:
        await asyncio.to_thread(reconstruct_dataset, run, chunks)

    async def gate(self, run: DatasetRun) -> GateVerdict:
        return GateVerdict.of_extra(gate_step(run))

    async def publish(self, run: DatasetRun) -> dict[str, Any]:
        return publish_step(run)


async def _run_dataset(run: DatasetRun, api_key: ApiKey | None) -> DatasetResult:
    started = time.monotonic()
    run = with_stored_traits(run)  # reconstruction's fingerprint, so the skip check's, has them
    end = await run_chain(run, LibrarySteps(api_key))
    if end.outcome == "skipped":
        return DatasetResult(end.run.name, "skipped", {"published": end.published})
    return DatasetResult(end.run.name, end.outcome,
                         end_summary(end, time.monotonic() - started))

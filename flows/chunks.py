"""Reconstruction of one dataset spread over several workers (machines).

With `reconstruct_spread: N` (N > 1) in the config and the dataset flow running as a deployment
run, the chunks are cut into N contiguous groups. Groups 2..N are deployment runs of
`reconstruct-chunks/spread` on the pool (any worker), group 1 runs here; each chunk's shard and
counts are written to the storage root by the chunk itself, so the dataset flow reads them from
there, not from the other worker. A group whose run has not started by the time this worker has
finished its own (plus `reconstruct_spread_wait_s`) is cancelled and done here, as is a group
whose run failed or crashed (chunks
are idempotent: finished ones are read back, not redone): a pool with no free worker slot cannot
stall the dataset.

Why deployment runs and not a Dask/Ray task runner: docs/ARCHITECTURE.md, "Running on many
machines" (measured by bench/scale.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from specregen.progress import Progress, publish
from tasks.common import ProgressArtifacts, chunk_rows, dataset_run
from tasks.gate import artifact_key
from tasks.reconstruction import reconstruct_chunk_task

CHUNK_DEPLOYMENT = "reconstruct-chunks/spread"
_NOT_STARTED = {"SCHEDULED", "PENDING", "LATE"}


@flow(name="reconstruct-chunks", flow_run_name="{dataset}-chunks-{first}-{last}",
      log_prints=False)
async def reconstruct_chunks_flow(config_path: str, dataset: str, first: int, last: int,
                                  fingerprint: str) -> int:
    """Chunks first..last (inclusive) of the dataset: shards written to storage."""
    await _watched(config_path, dataset, list(range(first, last + 1)), fingerprint)
    return last - first + 1


async def _local(config_path: str, dataset: str, chunks: list[int], fingerprint: str,
                 progress: Progress | None = None) -> list:
    async def one(k: int) -> dict:
        result = await reconstruct_chunk_task(config_path, dataset, k, fingerprint)
        if progress is not None:
            counts = result["counts"]
            done, failed = prompts_rebuilt(counts)
            progress.in_flight = max(0, progress.in_flight - done - failed)
            progress.advance(done=done, failed=failed, tokens=counts.get("completion_tokens", 0))
        return result

    return list(await asyncio.gather(*(one(k) for k in chunks)))


def prompts_rebuilt(counts: dict[str, int]) -> tuple[int, int]:
    """A chunk's (rebuilt, failed) in PROMPTS, the unit of the progress total (the chunk's
    prompt lines). A whole conversation is one prompt but one sample per user turn reached: it
    counts once, rebuilt when it gave samples, failed when it gave none (as `specregen infer`
    counts a conversation once, progress.engine_observer). A single-turn prompt is its one
    sample: rebuilt when ok or flagged, failed when an error or missing."""
    conversations = counts.get("conversations", 0)
    empty = counts.get("conversations_without_sample", 0)
    samples = counts.get("ok", 0) + counts.get("flagged", 0)
    errors = counts.get("error", 0)
    if conversations:
        # The counts do not say which samples with an error were a conversation's; the
        # pipeline never mixes (a dataset's `turns` applies to every row), so single-turn
        # prompts beside conversations count rebuilt when written, whatever their status.
        samples += errors
        errors = 0
    singles_done = samples - counts.get("conversation_samples", 0)
    singles_failed = errors + counts.get("missing", 0) - empty
    return singles_done + conversations - empty, singles_failed + empty


async def _watched(config_path: str, dataset: str, chunks: list[int],
                   fingerprint: str) -> list:
    """`_local` with live numbers: prompts rebuilt / failed (a conversation counts once),
    per minute, time left, on
    `specregen run`'s board and as a progress artifact (one per chunk group)."""
    run = dataset_run(config_path, dataset)
    rows = [chunk_rows(run, k) for k in chunks]
    total = None if None in rows else sum(r for r in rows if r is not None)
    where = f"chunks {chunks[0]}-{chunks[-1]}" if chunks else "no chunks"
    progress = Progress(f"reconstruct {dataset} {where}", total=total, interval=2.0,
                        observers=[publish], names=("rebuilt", "failed"))
    artifact = ProgressArtifacts(
        artifact_key(dataset, f"reconstruct-chunks-{chunks[0]}-{chunks[-1]}" if chunks
                     else "reconstruct"), f"Reconstruction of {dataset}, {where}")
    progress.subscribe(artifact)
    # In flight: the prompts of the chunks started and not yet finished (all of them at
    # once here; the process pool takes reconstruct_workers at a time).
    progress.set(in_flight=total or 0)
    try:
        results = await _local(config_path, dataset, chunks, fingerprint, progress)
    finally:
        progress.close()
        await artifact.aclose()
    return results


def _deployed() -> bool:
    """This flow run belongs to a deployment (a worker runs it): only then do other workers
    exist to take chunk groups."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return bool(context and context.flow_run and context.flow_run.deployment_id)


def groups(chunks: int, parts: int) -> list[list[int]]:
    """`chunks` chunk numbers cut into at most `parts` contiguous, near-equal groups."""
    parts = max(1, min(parts, chunks))
    size, extra = divmod(chunks, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(range(start, end)))
        start = end
    return [g for g in out if g]


async def reconstruct_chunks(config_path: str, dataset: str, chunks: int,
                             fingerprint: str) -> list[dict[str, Any]]:
    """Every chunk's {shard, counts}, in chunk order; spread when the config says so."""
    run = dataset_run(config_path, dataset)
    spread = run.config.reconstruct_spread
    if spread <= 1 or chunks < 2 or not _deployed():
        return await _watched(config_path, dataset, list(range(chunks)), fingerprint)
    logger = get_run_logger()
    mine, *others = groups(chunks, spread)
    parent = flow_run.get_id()
    remote = [
        await run_deployment(
            CHUNK_DEPLOYMENT,
            parameters={"config_path": config_path, "dataset": dataset, "first": g[0],
                        "last": g[-1], "fingerprint": fingerprint},
            timeout=0, as_subflow=True, idempotency_key=f"{parent}:{dataset}:chunks:{g[0]}",
        )
        for g in others
    ]
    logger.info("%s: reconstruction spread over %d runs (chunks %s here)", dataset,
                len(remote) + 1, f"{mine[0]}-{mine[-1]}")
    await _watched(config_path, dataset, mine, fingerprint)
    start_by = time.monotonic() + run.config.reconstruct_spread_wait_s
    await asyncio.gather(*(_finish(g, r.id, config_path, dataset, fingerprint, start_by)
                           for g, r in zip(others, remote, strict=True)))
    # Every shard is in storage now: read back in chunk order (cached task results or the
    # chunk's own .json, never recomputed).
    return await _local(config_path, dataset, list(range(chunks)), fingerprint)


async def _finish(group: list[int], run_id: Any, config_path: str, dataset: str,
                  fingerprint: str, start_by: float = 0.0, poll_s: float = 1.0) -> None:
    """Wait for a group's run; do the group here if it did not start by `start_by`
    (time.monotonic) or did not complete."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    logger = get_run_logger()
    async with get_client() as client:
        while True:
            state = (await client.read_flow_run(run_id)).state
            kind = state.type.value if state is not None else "SCHEDULED"
            if state is not None and state.is_completed():
                return
            if kind in _NOT_STARTED and time.monotonic() >= start_by:
                result = await client.set_flow_run_state(
                    run_id, Cancelled(message="done by the dataset's own worker"))
                if result.status.value == "ACCEPT":
                    logger.info("%s: chunks %d-%d found no free worker; done here", dataset,
                                group[0], group[-1])
                    break
            elif state is not None and state.is_final():
                logger.warning("%s: chunks %d-%d ended %s elsewhere; done here", dataset,
                               group[0], group[-1], state.name)
                break
            await asyncio.sleep(poll_s)
    await _watched(config_path, dataset, group, fingerprint)

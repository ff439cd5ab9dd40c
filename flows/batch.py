"""Batch mode under Prefect: submit every chunk's batches, then wait without holding a worker.

Why a suspended run plus a scheduled poller (docs/batch.md): a batch takes up to 24 h. A flow
run that sleeps or pauses in-process keeps its worker process (and its slot in the work pool)
for that day. `suspend_flow_run` instead ends the process and leaves the run Suspended; the
`batch-poll` deployment runs every few minutes as a short flow run: for each suspended dataset
run it takes the dataset's lease, makes one batch pass per chunk (poll, record finished
results, resubmit failures: seconds), and resumes the dataset run once no batch is open. The
resumed run starts again from the top: every finished stage is a cache hit or a skip, the
chunks' passes find their summaries, and the run goes on to reconstruction.

Nothing is ever submitted twice: the batch ledger in each chunk's raw log records every batch
before and after its submit, so a rerun, a UI retry or the poller finds them (client/batch.py).
A flow run without a deployment (a local `prefect` run, tests) cannot be suspended; it polls
in its own process instead, which is what a local run wants anyway.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import aupdate_progress_artifact

from specregen.config import load_config
from specregen.errors import OutputBusyError
from specregen.pipeline.run import dataset_lease
from tasks.artifacts import amarkdown_artifact
from tasks.batch import batch_chunk_task
from tasks.common import dataset_run
from tasks.gate import artifact_key

# A suspended dataset run fails when nobody resumed it by then: the batch window (24 h) plus
# time for the poller to collect and resubmit.
SUSPEND_TIMEOUT_S = 30 * 3600
SUSPENDED = "Suspended"


async def infer_in_batches(
    config_path: str, dataset: str, chunks: int, fingerprint: str, progress: Any = None,
) -> list[dict]:
    """Every chunk through the batch API; returns the chunks' summaries once all are final."""
    logger = get_run_logger()
    poll = dataset_run(config_path, dataset).config.endpoint.batch.poll_seconds
    while True:
        results = await asyncio.gather(
            *(batch_chunk_task(config_path, dataset, k, fingerprint) for k in range(chunks)))
        if progress is not None:
            done, total, text = batch_progress(list(results))
            await aupdate_progress_artifact(progress, 100.0 * done / max(1, total),
                                            description=f"{dataset}: {text}")
        open_ids = sorted(i for r in results for i in r.get("open_batches") or ())
        if not open_ids:
            await amarkdown_artifact(cost_markdown(dataset, list(results)),
                                     key=artifact_key(dataset, "cost"),
                                     description=f"{dataset}: cost view (batch mode)")
            return list(results)
        logger.info("%s: %d batches running; waiting", dataset, len(open_ids))
        if _deployed():
            # Keyed by the open batches: a run resumed while the same batches still run (a
            # click on Resume) does not suspend on the same key again, it polls below.
            key = "batches-" + hashlib.sha256("\n".join(open_ids).encode()).hexdigest()[:16]
            from prefect.flow_runs import asuspend_flow_run

            await asuspend_flow_run(timeout=SUSPEND_TIMEOUT_S, key=key)  # exits the process
        await asyncio.sleep(poll)


def _deployed() -> bool:
    """This flow run was created from a deployment (only those can be suspended: a worker
    starts them again on resume)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    return bool(run is not None and run.deployment_id)


def cost_markdown(dataset: str, results: list[dict]) -> str:
    """Spent, projected total, the realtime equivalent and the savings, summed over chunks."""
    def total(name: str) -> float:
        return sum(float(r.get(name) or 0.0) for r in results)

    rows = [("spent", total("spent_total_usd")),
            ("projected total", total("projected_total_usd")),
            ("same answers realtime", total("realtime_equivalent_total_usd")),
            ("savings vs realtime", total("savings_total_usd"))]
    lines = [f"# {dataset}: cost (USD)", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value:.4f} |" for name, value in rows]
    return "\n".join(lines) + "\n"


def batch_progress(results: list[dict]) -> tuple[int, int, str]:
    """Requests done, requests in all, and the line the progress artifact shows."""
    submitted = sum(r.get("batches_total", 0) for r in results)
    finished = sum(r.get("batches_done_total", 0) for r in results)
    total = sum(r.get("prompts", 0) for r in results)
    done = sum(r.get(k, 0) for r in results for k in ("ok", "truncated", "failed", "skipped"))
    cost = sum(r.get("spent_total_usd", 0.0) for r in results)
    text = (f"batches submitted {submitted}, finished {finished}; requests done {done}/{total};"
            f" spent ${cost:.4f}")
    return done, total, text


@flow(name="batch-poll", log_prints=False)
async def batch_poll_flow(config_path: str) -> list[dict]:
    """One pass over every suspended batch-mode dataset run of this config (see the module
    docstring); resumes the runs whose batches are all finished and recorded."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateName,
    )
    from prefect.flow_runs import aresume_flow_run

    logger = get_run_logger()
    config = load_config(config_path)
    if config.endpoint.mode != "batch":
        return []
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["dataset"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(name=FlowRunFilterStateName(any_=[SUSPENDED]))),
        )
    report = []
    for suspended in runs:
        params = suspended.parameters or {}
        dataset = params.get("dataset")
        if params.get("config_path") != config_path or not isinstance(dataset, str):
            continue
        run = dataset_run(config_path, dataset)
        chunks = _chunk_count(run)
        fingerprint = f"{run.prompts_fp}-{run.endpoint_fp}"
        try:
            lease = await asyncio.to_thread(dataset_lease, run, wait=0.0)
        except OutputBusyError:
            continue  # someone works on it right now
        with lease:
            results = await asyncio.gather(
                *(batch_chunk_task(config_path, dataset, k, fingerprint) for k in range(chunks)))
        still = sum(r.get("batches_open", 0) for r in results)
        _, _, text = batch_progress(list(results))
        logger.info("%s: %s; %d batches open", dataset, text, still)
        resumed = False
        if not still:
            try:
                await aresume_flow_run(suspended.id)
                resumed = True
            except RuntimeError as exc:  # resumed meanwhile, or not resumable: say so, go on
                logger.warning("%s: cannot resume flow run %s: %s", dataset, suspended.name,
                               exc)
        report.append({"dataset": dataset, "flow_run": suspended.name, "open": still,
                       "resumed": resumed})
    return report


def _chunk_count(run: Any) -> int:
    from specregen.store.manifest import read_manifest

    manifest = read_manifest(run.store, run.name, "prompts", run.prompts_fp)
    return int(manifest.counts["chunks"]) if manifest is not None else 0

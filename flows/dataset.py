"""One dataset: the stage chain (specregen/pipeline/chain.py) run as Prefect tasks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.runtime import flow_run as prefect_flow_run

from flows.chunks import reconstruct_chunks
from specregen.errors import OutputBusyError, PartialFailureError
from specregen.pipeline.chain import ProbeStep, run_chain
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.run import dataset_lease
from specregen.pipeline.summary import end_summary, summary_markdown
from specregen.pipeline.window import each_chunk
from specregen.store.lease import DEFAULT_TTL
from tasks.artifacts import amarkdown_artifact
from tasks.check import check_before_paying_task
from tasks.common import dataset_run
from tasks.gate import artifact_key, gate_task
from tasks.inference import infer_chunk_task
from tasks.probe import probe_stage_task
from tasks.prompts import prepare_prompts_task
from tasks.publish import publish_task
from tasks.reconstruction import finish_reconstruction_task
from tasks.skip import skip_check_task

# A run set back to Scheduled after a crash (infra/automations.py) runs again at most this many
# times in all; then it fails (Failed, not Crashed), so the automation stops rerunning it.
MAX_RUNS = 4


class RerunLimitError(PartialFailureError):
    """The dataset's flow run crashed too often."""


@flow(name="dataset", flow_run_name="{dataset}", log_prints=False)
async def dataset_flow(config_path: str, dataset: str, lease_wait: float = 0.0) -> dict:
    """One writer per dataset and storage, whichever server or process runs it: the dataset's
    lease is held from before the first request to publish (a second run waits `lease_wait`
    s, then fails naming the holder)."""
    run = dataset_run(config_path, dataset)
    logger = get_run_logger()
    runs = prefect_flow_run.run_count
    if runs > MAX_RUNS:
        raise RerunLimitError(f"{dataset}: its flow run crashed {runs - 1} times; not rerun",
                              hint="read the crashed runs' logs (memory? a killed machine?)")
    if runs > 1:  # rerun after a crash: the dead holder's lease expires after its ttl
        lease_wait = max(lease_wait, 2.5 * DEFAULT_TTL)
    try:
        lease = await asyncio.to_thread(dataset_lease, run, wait=0.0)
    except OutputBusyError as busy:
        if lease_wait <= 0:
            raise
        logger.info("%s: waiting up to %g s for the run that holds it: %s", dataset,
                    lease_wait, str(busy))
        lease = await asyncio.to_thread(dataset_lease, run, wait=lease_wait)
    with lease:
        return await _dataset_chain(config_path, dataset)


class FlowSteps:
    """The chain's stages (specregen/pipeline/chain.py) as Prefect tasks: progress and report
    artifacts, batch inference without a worker, reconstruction spread over workers. A probe
    refusal and a failed gate are their tasks' results, not errors: the chain ends with them,
    and the flow publishes the run summary before it fails (`_dataset_chain`)."""

    def __init__(self, config_path: str, dataset: str) -> None:
        self.config_path = config_path
        self.dataset = dataset

    async def published(self, run: DatasetRun) -> dict | None:
        return skip_check_task(self.config_path, self.dataset)

    async def check_before_paying(self, run: DatasetRun) -> None:
        await check_before_paying_task(self.config_path, self.dataset)

    async def probe(self, run: DatasetRun) -> ProbeStep:
        # The run is read again: it now carries the endpoint's traits.
        summary = await probe_stage_task(self.config_path, self.dataset)
        return ProbeStep.of_summary(dataset_run(self.config_path, self.dataset), summary)

    async def prompts(self, run: DatasetRun) -> int:
        prompts = prepare_prompts_task(self.config_path, self.dataset)
        get_run_logger().info("%s: %d prompts in %d chunks, %d rows refused", self.dataset,
                              prompts["prompts"], prompts["chunks"], prompts["rejected"])
        return prompts["chunks"]

    async def infer(self, run: DatasetRun, chunks: int) -> list[dict]:
        config_path, dataset = self.config_path, self.dataset
        progress = await acreate_progress_artifact(0.0, key=artifact_key(dataset, "progress"),
                                                   description=f"{dataset}: chunks answered")
        infer_fp = f"{run.prompts_fp}-{run.endpoint_fp}"
        if run.config.endpoint.mode == "batch":  # submit, then wait without a worker
            from flows.batch import infer_in_batches  # (docs/batch.md)

            return list(await infer_in_batches(config_path, dataset, chunks, infer_fp,
                                               progress))
        finished = 0

        async def infer(k: int) -> dict:
            return await infer_chunk_task(config_path, dataset, k, infer_fp)

        async def answered(_k: int, _result: dict) -> None:
            nonlocal finished
            finished += 1
            # The numbers in the description too: the artifact's key page shows only that.
            await aupdate_progress_artifact(
                progress, 100.0 * finished / max(1, chunks),
                description=f"{dataset}: {finished} of {chunks} chunks answered")

        return await each_chunk(run.config, chunks, infer, answered)

    async def reconstruct(self, run: DatasetRun, chunks: int) -> None:
        # On this worker, or spread over others with `reconstruct_spread` (flows/chunks.py).
        shards = await reconstruct_chunks(self.config_path, self.dataset, chunks,
                                          run.reconstruct_fp)
        finish_reconstruction_task(self.config_path, self.dataset, list(shards))

    async def gate(self, run: DatasetRun) -> GateVerdict:
        return GateVerdict.of_extra(gate_task(self.config_path, self.dataset))

    async def publish(self, run: DatasetRun) -> dict:
        return publish_task(self.config_path, self.dataset)


async def _dataset_chain(config_path: str, dataset: str) -> dict[str, Any]:
    logger = get_run_logger()
    started = time.monotonic()
    end = await run_chain(dataset_run(config_path, dataset), FlowSteps(config_path, dataset))
    if end.outcome == "skipped":
        done = end.published or {}
        logger.info("%s is already published (%s); skipping", dataset, done.get("fingerprint"))
        return {"dataset": dataset, "outcome": "skipped", **done}
    summary = end_summary(end, time.monotonic() - started)
    await amarkdown_artifact(summary_markdown(summary),
                             key=artifact_key(dataset, "summary"),
                             description=f"Run summary of {dataset}")
    failure = end.failure()
    if failure is not None:
        # Here, after the summary is published, not inside a task: the run ends Failed with
        # the stage's reason, and its page still shows what the run did and cost.
        logger.error("%s: %s", dataset, summary["outcome"])
        raise failure
    return summary

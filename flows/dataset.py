"""One dataset: the stage chain (specregen/pipeline/chain.py) run as Prefect tasks."""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.runtime import flow_run as prefect_flow_run

from flows.chunks import reconstruct_chunks
from specregen.errors import OutputBusyError, PartialFailureError
from specregen.pipeline.chain import ProbeStep, run_chain
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.run import dataset_lease, summarize
from specregen.store.lease import DEFAULT_TTL
from specregen.store.manifest import read_manifest
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
    refusal and a failed gate raise inside their tasks, so the flow run fails with them."""

    def __init__(self, config_path: str, dataset: str) -> None:
        self.config_path = config_path
        self.dataset = dataset

    async def published(self, run: DatasetRun) -> dict | None:
        return skip_check_task(self.config_path, self.dataset)

    async def check_before_paying(self, run: DatasetRun) -> None:
        await check_before_paying_task(self.config_path, self.dataset)

    async def probe(self, run: DatasetRun) -> ProbeStep:
        # Raises ProbeRefusal before paying. The run is read again: it now carries the
        # endpoint's traits.
        summary = await probe_stage_task(self.config_path, self.dataset)
        return ProbeStep(dataset_run(self.config_path, self.dataset), summary)

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
        window = asyncio.Semaphore(run.config.chunks_in_flight)
        finished = 0

        async def infer(k: int) -> dict:
            nonlocal finished
            async with window:
                result = await infer_chunk_task(config_path, dataset, k, infer_fp)
            finished += 1
            # The numbers in the description too: the artifact's key page shows only that.
            await aupdate_progress_artifact(
                progress, 100.0 * finished / max(1, chunks),
                description=f"{dataset}: {finished} of {chunks} chunks answered")
            return result

        return list(await asyncio.gather(*(infer(k) for k in range(chunks))))

    async def reconstruct(self, run: DatasetRun, chunks: int) -> None:
        # On this worker, or spread over others with `reconstruct_spread` (flows/chunks.py).
        shards = await reconstruct_chunks(self.config_path, self.dataset, chunks,
                                          run.reconstruct_fp)
        finish_reconstruction_task(self.config_path, self.dataset, list(shards))

    async def gate(self, run: DatasetRun) -> GateVerdict:
        gate_task(self.config_path, self.dataset)  # raises when the dataset fails its gate
        gated = read_manifest(run.store, run.name, "gate", run.gate_fp)
        return GateVerdict.of(gated) if gated is not None else GateVerdict(False, ("no gate "
                                                                                  "manifest",))

    async def publish(self, run: DatasetRun) -> dict:
        return publish_task(self.config_path, self.dataset)


async def _dataset_chain(config_path: str, dataset: str) -> dict:
    logger = get_run_logger()
    started = time.monotonic()
    end = await run_chain(dataset_run(config_path, dataset), FlowSteps(config_path, dataset))
    run = end.run
    if end.outcome == "skipped":
        done = end.published or {}
        logger.info("%s is already published (%s); skipping", dataset, done.get("fingerprint"))
        return {"dataset": dataset, "outcome": "skipped", **done}
    summary = summarize(
        run,
        read_manifest(run.store, run.name, "prompts", run.prompts_fp),
        list(end.inferred),
        read_manifest(run.store, run.name, "reconstruct", run.reconstruct_fp),
        read_manifest(run.store, run.name, "gate", run.gate_fp),
        time.monotonic() - started,
        probe=end.probe.summary if end.probe else None,
    )
    summary.update(outcome=end.outcome)
    if end.outcome == "published":
        summary.update(published=end.published)
    await amarkdown_artifact(summary_markdown(summary),
                             key=artifact_key(dataset, "summary"),
                             description=f"Run summary of {dataset}")
    return summary


def summary_markdown(summary: dict) -> str:
    gate = summary.get("gate", {})
    rows = [
        ("prompts", summary["prompts"]),
        ("rows refused by the adapter", summary["rejected_rows"]),
        ("prompts not sent (over the context, not JSON)", summary.get("rejected_requests", 0)),
        ("requests sent", summary["requests_sent"]),
        ("permanently failed", summary["failed_requests"]),
        ("accepted", gate.get("accepted")),
        ("quarantined", gate.get("quarantined")),
        ("completion tokens", summary["completion_tokens"]),
        ("cost (USD)", summary["cost_usd"]),
        *([("projected total (USD)", summary["projected_total_usd"]),
           ("same answers realtime (USD)", summary["realtime_equivalent_usd"]),
           ("savings vs realtime (USD)", summary["savings_usd"])]
          if "projected_total_usd" in summary else []),
        *_conversation_rows(summary.get("conversations")),
        ("endpoint probe", "{status}, {requests} requests".format(**summary["probe"])
         if summary.get("probe") else "-"),
        ("reference match", summary["reference_match"] or "-"),
        ("wall time (s)", summary["wall_s"]),
        ("published", summary.get("published", {}).get("path", "-")),
        ("gate report", summary.get("gate_report", "-")),
    ]
    lines = [f"# {summary['dataset']}: {summary.get('outcome', '')}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"


def _conversation_rows(conv: dict | None) -> list[tuple[str, object]]:
    """A `turns: all` dataset: its conversations, how they stopped, how many user turns they
    reached (one sample per user turn)."""
    if not conv:
        return []
    count = f"{conv['count']}" + (f" ({conv['samples']} samples, one per user turn reached)"
                                  if conv.get("samples") else "")
    rows: list[tuple[str, object]] = [("conversations", count)]
    rows += [(f"conversations by stop reason: `{reason}`", n)
             for reason, n in conv.get("by_stop_reason", {}).items()]
    if conv.get("user_turns"):
        rows.append(("conversations by user turns reached", ", ".join(
            f"{turns} turns: {n}" for turns, n in conv["user_turns"].items())))
    return rows

"""One dataset: skip-if-done, inference chunks, reconstruction shards, the gate, publish."""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_run_logger
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)

from specregen.pipeline.run import summarize
from specregen.store.manifest import read_manifest
from tasks.common import dataset_run
from tasks.gate import artifact_key, gate_task
from tasks.inference import infer_chunk_task
from tasks.probe import check_endpoint_task
from tasks.prompts import prepare_prompts_task
from tasks.publish import publish_task
from tasks.reconstruction import finish_reconstruction_task, reconstruct_chunk_task
from tasks.skip import skip_check_task


@flow(name="dataset", flow_run_name="{dataset}", log_prints=False)
async def dataset_flow(config_path: str, dataset: str) -> dict:
    logger = get_run_logger()
    started = time.monotonic()
    run = dataset_run(config_path, dataset)
    done = skip_check_task(config_path, dataset)
    if done is not None:
        logger.info("%s is already published (%s); skipping", dataset, done["fingerprint"])
        return {"dataset": dataset, "outcome": "skipped", **done}

    profile = check_endpoint_task(config_path, dataset)  # raises ProbeRefusal before paying
    if profile is not None:
        logger.info("%s: the endpoint's probe (%s) allows its tool calls", dataset, profile)
    prompts = prepare_prompts_task(config_path, dataset)
    chunks = prompts["chunks"]
    logger.info("%s: %d prompts in %d chunks, %d rows refused", dataset, prompts["prompts"],
                chunks, prompts["rejected"])
    progress = await acreate_progress_artifact(0.0, key=artifact_key(dataset, "progress"),
                                               description=f"{dataset}: chunks answered")
    infer_fp = f"{run.prompts_fp}-{run.endpoint_fp}"
    window = asyncio.Semaphore(run.config.chunks_in_flight)
    finished = 0

    async def infer(k: int) -> dict:
        nonlocal finished
        async with window:
            result = await infer_chunk_task(config_path, dataset, k, infer_fp)
        finished += 1
        await aupdate_progress_artifact(progress, 100.0 * finished / max(1, chunks))
        return result

    inferred = await asyncio.gather(*(infer(k) for k in range(chunks)))
    shards = await asyncio.gather(
        *(reconstruct_chunk_task(config_path, dataset, k, run.reconstruct_fp)
          for k in range(chunks))
    )
    finish_reconstruction_task(config_path, dataset, list(shards))
    gate_task(config_path, dataset)  # raises when the dataset fails its gate
    published = publish_task(config_path, dataset)

    summary = summarize(
        run,
        read_manifest(run.store, run.name, "prompts", run.prompts_fp),
        list(inferred),
        read_manifest(run.store, run.name, "reconstruct", run.reconstruct_fp),
        read_manifest(run.store, run.name, "gate", run.gate_fp),
        time.monotonic() - started,
    )
    summary.update(outcome="published", published=published)
    await acreate_markdown_artifact(summary_markdown(summary),
                                    key=artifact_key(dataset, "summary"),
                                    description=f"Run summary of {dataset}")
    return summary


def summary_markdown(summary: dict) -> str:
    gate = summary.get("gate", {})
    rows = [
        ("prompts", summary["prompts"]),
        ("rows refused by the adapter", summary["rejected_rows"]),
        ("requests sent", summary["requests_sent"]),
        ("permanently failed", summary["failed_requests"]),
        ("accepted", gate.get("accepted")),
        ("quarantined", gate.get("quarantined")),
        ("completion tokens", summary["completion_tokens"]),
        ("cost (USD)", summary["cost_usd"]),
        ("reference match", summary["reference_match"] or "-"),
        ("wall time (s)", summary["wall_s"]),
        ("published", summary.get("published", {}).get("path", "-")),
        ("gate report", summary.get("gate_report", "-")),
    ]
    lines = [f"# {summary['dataset']}: {summary.get('outcome', '')}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"

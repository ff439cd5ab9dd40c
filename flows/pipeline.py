"""The parent flow: every dataset of a config in parallel; one failing does not stop the others."""

from __future__ import annotations

import asyncio

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from flows.dataset import dataset_flow
from specregen.config import load_config

DATASET_DEPLOYMENT = "dataset/{dataset}"


class DatasetsFailedError(RuntimeError):
    """Some datasets failed; the others finished (see the run summary)."""


@flow(name="pipeline", log_prints=False)
async def pipeline_flow(
    config_path: str, datasets: list[str] | None = None, use_deployments: bool = False
) -> list[dict]:
    """Run the datasets; with `use_deployments`, each as its own deployment run (retryable
    alone from the UI), else as subflows in this process."""
    logger = get_run_logger()
    config = load_config(config_path)
    names = datasets or [d.name for d in config.datasets]
    for name in names:
        config.dataset(name)  # an unknown name fails before anything starts

    async def one(name: str) -> dict:
        if use_deployments:
            run = await run_deployment(
                DATASET_DEPLOYMENT.format(dataset=name),
                parameters={"config_path": config_path, "dataset": name},
                timeout=None,
                as_subflow=True,
                idempotency_key=f"{flow_run.get_id()}:{name}",
            )
            state = run.state
        else:
            state = await dataset_flow(config_path, name, return_state=True)
        if state is not None and state.is_completed():
            if use_deployments:  # its result lives with its own run; the UI shows it
                return {"dataset": name, "outcome": "completed", "flow_run": run.name}
            return await state.aresult()
        message = state.message if state is not None else "no state"
        logger.error("%s failed: %s", name, message)
        return {"dataset": name, "outcome": "failed", "error": message}

    results = await asyncio.gather(*(one(name) for name in names))
    await acreate_table_artifact(
        [{"dataset": r.get("dataset"), "outcome": r.get("outcome"),
          "accepted": r.get("gate", {}).get("accepted"),
          "quarantined": r.get("gate", {}).get("quarantined"),
          "cost_usd": r.get("cost_usd"), "error": r.get("error", "")} for r in results],
        key="pipeline-summary", description="Datasets of this pipeline run",
    )
    failed = [r["dataset"] for r in results if r.get("outcome") == "failed"]
    if failed:
        raise DatasetsFailedError(f"datasets failed: {', '.join(failed)}; the others finished")
    return results

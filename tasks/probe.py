from __future__ import annotations

import asyncio

from prefect import get_run_logger, task

from specregen.pipeline.apikey import load_api_key
from specregen.pipeline.probing import (
    probe_and_store,
    probe_markdown,
    probe_stage,
    probe_wanted,
    read_profile,
)
from tasks.artifacts import amarkdown_artifact
from tasks.common import dataset_run
from tasks.gate import artifact_key
from tasks.secrets import read_prefect_secret


@task(name="probe-stage", retries=0)
async def probe_stage_task(config_path: str, dataset: str) -> dict:
    """Before paying: the endpoint's profile (probed now when the config's `probe` mode wants
    one and none is stored), shown as an artifact. Its summary's `refusal` says when this
    dataset's tool calls would come back unrecoverable: a result, not an error (the flow fails
    once the run summary is out, pipeline/chain.py). Not retried: a refusal stays a refusal."""
    run = dataset_run(config_path, dataset)
    # The key only when a probe may be sent: a stored profile needs none.
    may_probe = probe_wanted(run) and read_profile(run)[0] is None
    key = await load_api_key(run.config, read_prefect_secret) if may_probe else None
    outcome = await asyncio.to_thread(probe_stage, run, key)
    logger = get_run_logger()
    if outcome.status == "off":
        logger.warning("%s: %s", dataset, outcome.notes[0])
    elif outcome.status in ("probed", "failed"):
        logger.info("%s: probed the endpoint: %d requests, $%.6f", dataset, outcome.requests,
                    outcome.cost_usd)
    if outcome.status != "not_needed":
        await amarkdown_artifact(probe_markdown(outcome), key=artifact_key(dataset, "probe"),
                                 description=f"{dataset}: the endpoint probe")
    return outcome.summary()


@task(name="probe-endpoint", retries=1)
async def probe_task(config_path: str, dataset: str) -> dict:
    """Probe the endpoint now, whatever is stored, and store its profile (the `probe` flow)."""
    run = dataset_run(config_path, dataset)
    key = await load_api_key(run.config, read_prefect_secret)
    profile = await asyncio.to_thread(probe_and_store, run, key)
    return profile.to_dict()

from __future__ import annotations

import asyncio

from prefect import get_run_logger, task

from specregen.client.secrets import ApiKey
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import (
    probe_and_store,
    probe_markdown,
    probe_stage,
    probe_wanted,
    read_profile,
)
from specregen.pipeline.run import resolve_api_key
from specregen.probe.refusal import ProbeRefusal
from tasks.artifacts import amarkdown_artifact
from tasks.common import dataset_run
from tasks.gate import artifact_key


async def _api_key(run: DatasetRun) -> ApiKey | None:
    secret = None
    if run.config.api_key_secret:
        from prefect.blocks.system import Secret

        secret = (await Secret.aload(run.config.api_key_secret)).get()
    return resolve_api_key(run.config, secret)


@task(name="probe-stage", retries=0)
async def probe_stage_task(config_path: str, dataset: str) -> dict:
    """Before paying: the endpoint's profile (probed now when the config's `probe` mode wants
    one and none is stored), shown as an artifact; raises ProbeRefusal when this dataset's tool
    calls would come back unrecoverable. Not retried: a refusal stays a refusal."""
    run = dataset_run(config_path, dataset)
    # The key only when a probe may be sent: a stored profile needs none.
    may_probe = probe_wanted(run) and read_profile(run)[0] is None
    key = await _api_key(run) if may_probe else None
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
    if outcome.refusal is not None:
        raise ProbeRefusal(outcome.refusal)
    return outcome.summary()


@task(name="probe-endpoint", retries=1)
async def probe_task(config_path: str, dataset: str) -> dict:
    """Probe the endpoint now, whatever is stored, and store its profile (the `probe` flow)."""
    run = dataset_run(config_path, dataset)
    key = await _api_key(run)
    profile = await asyncio.to_thread(probe_and_store, run, key)
    return profile.to_dict()

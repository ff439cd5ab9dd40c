from __future__ import annotations

import asyncio

from prefect import task

from specregen.pipeline.probing import check_endpoint_for, probe_config_endpoint
from specregen.pipeline.run import resolve_api_key
from tasks.common import dataset_run


@task(name="check-endpoint-profile", retries=0)
def check_endpoint_task(config_path: str, dataset: str) -> str | None:
    """Refuse a tool-call dataset whose endpoint returns calls unrecoverably (no paid request)."""
    return check_endpoint_for(dataset_run(config_path, dataset))


@task(name="probe-endpoint", retries=1)
async def probe_task(config_path: str, dataset: str) -> dict:
    run = dataset_run(config_path, dataset)
    secret = None
    if run.config.api_key_secret:
        from prefect.blocks.system import Secret

        secret = (await Secret.aload(run.config.api_key_secret)).get()
    key = resolve_api_key(run.config, secret)
    profile = await asyncio.to_thread(probe_config_endpoint, run.config, run.endpoint_fp, key)
    return profile.to_dict()

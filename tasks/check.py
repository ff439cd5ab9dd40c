from __future__ import annotations

from prefect import task

from specregen.pipeline.apikey import load_api_key
from specregen.pipeline.run import check_before_paying
from tasks.common import dataset_run
from tasks.secrets import read_prefect_secret


@task(name="check-before-paying", retries=0)
async def check_before_paying_task(config_path: str, dataset: str) -> None:
    """The source is readable and the API key present, before the first paid request. Never
    retried: a missing source or key is the same on the next attempt."""
    run = dataset_run(config_path, dataset)
    # Not required here: a missing key is reported by check_before_paying, after the source.
    key = await load_api_key(run.config, read_prefect_secret, required=False)
    check_before_paying(run, api_key_found=key is not None)

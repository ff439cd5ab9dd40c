from __future__ import annotations

from prefect import task

from specregen.pipeline.prompts import prepare_prompts
from tasks.common import dataset_run, retry_unless_user_error


@task(name="prepare-prompts", retries=1, retry_condition_fn=retry_unless_user_error)
def prepare_prompts_task(config_path: str, dataset: str) -> dict:
    """Read the source once into chunks; returns their count and the rows refused."""
    manifest = prepare_prompts(dataset_run(config_path, dataset))
    return {"fingerprint": manifest.fingerprint, **manifest.counts}

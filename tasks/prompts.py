from __future__ import annotations

from prefect import task

from specregen.pipeline.prompts import prepare_prompts
from tasks.common import dataset_run


@task(name="prepare-prompts", retries=1)
def prepare_prompts_task(config_path: str, dataset: str) -> dict:
    """Read the source once into chunks; returns their count and the rows refused."""
    manifest = prepare_prompts(dataset_run(config_path, dataset))
    return {"fingerprint": manifest.fingerprint, **manifest.counts}

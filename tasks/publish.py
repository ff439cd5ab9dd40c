from __future__ import annotations

from prefect import task

from specregen.pipeline.steps import publish_step
from tasks.common import dataset_run


@task(name="publish", retries=1)
def publish_task(config_path: str, dataset: str) -> dict:
    """Publish after a passed gate (the chain's order): where it went and its counts."""
    return publish_step(dataset_run(config_path, dataset))

from __future__ import annotations

from prefect import task

from specregen.pipeline.steps import published_step
from tasks.common import dataset_run


@task(name="skip-if-done")
def skip_check_task(config_path: str, dataset: str) -> dict | None:
    """The published manifest when this exact dataset run is already published, else None."""
    return published_step(dataset_run(config_path, dataset))

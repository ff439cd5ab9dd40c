from __future__ import annotations

from prefect import task

from specregen.pipeline.publish import published
from tasks.common import dataset_run


@task(name="skip-if-done")
def skip_check_task(config_path: str, dataset: str) -> dict | None:
    """The published manifest when this exact dataset run is already published, else None."""
    manifest = published(dataset_run(config_path, dataset))
    return None if manifest is None else {"fingerprint": manifest.fingerprint, **manifest.counts}
